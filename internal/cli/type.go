package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/basalt-storage/basalt/internal/api"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/spf13/cobra"
)

func typeCmd(g *globals) *cobra.Command {
	cmd := group("type", "manage volume types (named layer stack templates)")
	var stackFile, description string
	create := &cobra.Command{
		Use: "create NAME --stack FILE.json [--description D]", Short: "create a volume type (admin)", Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if stackFile == "" {
				return errs.Invalid(errs.CodeInvalidStack, "--stack FILE.json is required (see docs/layers.md)")
			}
			b, err := os.ReadFile(stackFile)
			if err != nil {
				return errs.Invalid(errs.CodeInvalidStack, "reading --stack: %v", err)
			}
			if !json.Valid(b) {
				return errs.Invalid(errs.CodeInvalidStack, "%s is not valid JSON", stackFile)
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			t, err := c.CreateVolumeType(ctx(), api.CreateVolumeTypeRequest{Name: args[0], Description: description, Stack: b})
			if err != nil {
				return err
			}
			return g.emit(t, func(w *tabwriter.Writer) { typeTable(w, t) })
		},
	}
	create.Flags().StringVar(&stackFile, "stack", "", "JSON file with the layer stack template")
	create.Flags().StringVar(&description, "description", "", "one line for listings")
	list := &cobra.Command{
		Use: "list", Short: "list volume types", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ts, err := c.VolumeTypes(ctx())
			if err != nil {
				return err
			}
			return g.emit(ts, func(w *tabwriter.Writer) {
				fmt.Fprintln(w, "NAME\tBUILT-IN\tDESCRIPTION")
				for _, t := range ts {
					fmt.Fprintf(w, "%s\t%v\t%s\n", t.Name, t.BuiltIn, dash(t.Description))
				}
			})
		},
	}
	show := &cobra.Command{
		Use: "show NAME", Short: "show a volume type and its stack", Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			t, err := c.VolumeType(ctx(), args[0])
			if err != nil {
				return err
			}
			return g.emit(t, func(w *tabwriter.Writer) { typeTable(w, t) })
		},
	}
	del := &cobra.Command{
		Use: "delete NAME", Short: "delete a volume type (admin; its volumes keep their stacks)", Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if err := c.DeleteVolumeType(ctx(), args[0]); err != nil {
				return err
			}
			return g.emit(map[string]string{"deleted": args[0]}, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "deleted volume type %s\n", args[0])
			})
		},
	}
	cmd.AddCommand(create, list, show, del)
	return cmd
}

func typeTable(w *tabwriter.Writer, t *api.VolumeType) {
	fmt.Fprintf(w, "name:\t%s\nbuilt in:\t%v\ndescription:\t%s\nstack:\t%s\n", t.Name, t.BuiltIn, dash(t.Description), t.Stack)
}
