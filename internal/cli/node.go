package cli

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/basalt-storage/basalt/internal/api"
	"github.com/basalt-storage/basalt/internal/cluster"
	"github.com/spf13/cobra"
)

func nodeCmd(g *globals) *cobra.Command {
	cmd := group("node", "cluster membership (admin)")
	list := &cobra.Command{
		Use: "list", Short: "list the cluster's nodes: role (voter, learner, client) and health", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ns, err := c.Nodes(ctx())
			if err != nil {
				return err
			}
			return g.emit(ns, func(w *tabwriter.Writer) {
				fmt.Fprintln(w, "NAME\tROLE\tHEALTH\tAPI\tS3\tNBD")
				for _, n := range ns {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, n.Role, n.Health, dash(n.API), dash(n.S3), dash(n.NBD))
				}
			})
		},
	}
	remove := &cobra.Command{
		Use: "remove NAME", Short: "take a node out of the cluster (its metadata member too); a running node stops", Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if err := c.RemoveNode(ctx(), args[0]); err != nil {
				return err
			}
			return g.emit(map[string]string{"removed": args[0]}, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "removed node %s\n", args[0])
			})
		},
	}
	var ttl time.Duration
	var revoke string
	token := &cobra.Command{
		Use: "join-token [--ttl 24h | --revoke TOKEN]", Short: "issue a token a new node joins with (basalt server --join URL --join-token T), or revoke one", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if revoke != "" && cmd.Flags().Changed("ttl") {
				return usageErr("--revoke and --ttl do not go together")
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			if revoke != "" {
				if err := c.RevokeJoinToken(ctx(), revoke); err != nil {
					return err
				}
				return g.emit(map[string]bool{"revoked": true}, func(w *tabwriter.Writer) {
					fmt.Fprintln(w, "revoked the join token")
				})
			}
			t, err := c.JoinToken(ctx(), api.JoinTokenRequest{TTL: ttl.String()})
			if err != nil {
				return err
			}
			return g.emit(t, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "%s\n", t.Token)
			})
		},
	}
	token.Flags().DurationVar(&ttl, "ttl", cluster.DefaultJoinTokenTTL, "how long the token is valid")
	token.Flags().StringVar(&revoke, "revoke", "", "make this `token` unusable before it expires (nodes that joined with it stay)")
	cmd.AddCommand(list, remove, token)
	return cmd
}
