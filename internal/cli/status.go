package cli

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/size"
	"github.com/spf13/cobra"
)

func statusCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "status", Short: "show node, metadata and store health", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			st, err := c.Status(ctx())
			if err != nil {
				return err
			}
			err = g.emit(st, func(w *tabwriter.Writer) {
				health := map[bool]string{true: "healthy", false: "UNHEALTHY"}
				fmt.Fprintf(w, "node:\t%s (basalt %s, cluster %s)\napi:\t%s\nnbd:\t%s\n", st.Node.Name, st.Node.Version, st.Node.ClusterID, st.Node.API, st.Node.NBD)
				mode := "external etcd"
				if st.Metadata.Embedded {
					mode = "embedded etcd"
				}
				fmt.Fprintf(w, "metadata:\t%s — %s %s, %d member(s), db %s %v\n", health[st.Metadata.Healthy], mode,
					st.Metadata.Version, st.Metadata.Members, size.Format(st.Metadata.DBSize), st.Metadata.Endpoints)
				if st.Metadata.Error != "" {
					fmt.Fprintf(w, "\t%s\n", st.Metadata.Error)
				}
				for _, a := range st.Metadata.Alarms {
					fmt.Fprintf(w, "\talarm %s (see docs/operations.md: basalt meta defrag)\n", a)
				}
				fmt.Fprintf(w, "store:\t%s — %s, %s free of %s, %s provisioned of %s (overcommit %.1f)\n", health[st.Store.Healthy],
					st.Store.Path, size.Format(st.Store.FreeBytes), size.Format(st.Store.TotalBytes),
					size.Format(st.Store.ProvisionedBytes), size.Format(st.Store.LimitBytes), st.Store.Overcommit)
				if st.Store.Error != "" {
					fmt.Fprintf(w, "\t%s\n", st.Store.Error)
				}
			})
			if err == nil && (!st.Metadata.Healthy || !st.Store.Healthy) {
				// The status printed is the answer: the error goes to
				// stderr only, so that -o json leaves one document on
				// stdout (as the object commands do).
				g.stdout = io.Discard
				return errs.New(errs.KindUnavailable, "Unhealthy", "node %s is unhealthy", st.Node.Name)
			}
			return err
		},
	}
}

func metaCmd(g *globals) *cobra.Command {
	cmd := group("meta", "metadata store maintenance (admin)")
	cmd.AddCommand(&cobra.Command{
		Use:   "defrag",
		Short: "compact and defragment the metadata store and clear a NOSPACE alarm",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if err := c.Defrag(ctx()); err != nil {
				return err
			}
			return g.emit(map[string]string{"status": "defragmented"}, func(w *tabwriter.Writer) {
				fmt.Fprintln(w, "metadata compacted and defragmented")
			})
		},
	})
	return cmd
}
