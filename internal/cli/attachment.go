package cli

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/basalt-storage/basalt/internal/api"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/spf13/cobra"
)

func attachCmd(g *globals) *cobra.Command {
	var req api.AttachRequest
	cmd := &cobra.Command{
		Use:   "attach VOLUME --host HOST [--mode rw|ro]",
		Short: "attach a volume to a host; prints the NBD URI to use",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if req.Host == "" {
				return usageErr("--host is required")
			}
			req.Volume = args[0]
			c, err := g.client()
			if err != nil {
				return err
			}
			a, err := c.Attach(ctx(), req)
			if err != nil {
				return err
			}
			return g.emit(a, func(w *tabwriter.Writer) { attachmentTable(w, a) })
		},
	}
	cmd.Flags().StringVar(&req.Host, "host", "", "host the volume is attached to (a label)")
	cmd.Flags().StringVar(&req.Mode, "mode", "rw", "rw or ro")
	return cmd
}

func detachCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "detach ATTACHMENT_ID",
		Short: "detach: the export stops working and open NBD connections close",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if err := c.Detach(ctx(), args[0]); err != nil {
				return notAttachmentID(err, args[0])
			}
			return g.emit(map[string]string{"detached": args[0]}, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "detached %s\n", args[0])
			})
		},
	}
}

func attachmentCmd(g *globals) *cobra.Command {
	cmd := group("attachment", "list and show attachments")
	var volume string
	list := &cobra.Command{
		Use: "list [--volume V]", Short: "list attachments", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			as, err := c.Attachments(ctx(), volume)
			if err != nil {
				return err
			}
			return g.emit(as, func(w *tabwriter.Writer) {
				fmt.Fprintln(w, "ID\tVOLUME\tHOST\tMODE\tNBD URI")
				for _, a := range as {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", a.ID, a.VolumeID, a.Host, a.Mode, a.NBDURI)
				}
			})
		},
	}
	list.Flags().StringVar(&volume, "volume", "", "only attachments of this volume")
	show := &cobra.Command{
		Use: "show ID", Short: "show an attachment", Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			a, err := c.Attachment(ctx(), args[0])
			if err != nil {
				return notAttachmentID(err, args[0])
			}
			return g.emit(a, func(w *tabwriter.Writer) { attachmentTable(w, a) })
		},
	}
	cmd.AddCommand(list, show)
	return cmd
}

func attachmentTable(w *tabwriter.Writer, a *api.Attachment) {
	fmt.Fprintf(w, "id:\t%s\nvolume:\t%s\nhost:\t%s\nmode:\t%s\nstatus:\t%s\nnbd uri:\t%s\ncreated:\t%s\n",
		a.ID, a.VolumeID, a.Host, a.Mode, a.Status, a.NBDURI, a.CreatedAt.Format(time.RFC3339))
}

// notAttachmentID adds to a NotFound for ref, which is no attachment id,
// where the attachment's id is found: attachments have no names, and
// `basalt detach VOLUME` is what an EBS user types (detach-volume takes
// the volume). The server's code and message are kept.
func notAttachmentID(err error, ref string) error {
	e, ok := errs.As(err)
	if !ok || e.Code != errs.CodeNotFound || strings.HasPrefix(ref, "att-") {
		return err
	}
	return &errs.Error{Kind: e.Kind, Code: e.Code, Message: fmt.Sprintf(
		"%s; this takes an attachment id (att-…), not a volume: find it with `basalt attachment list --volume %s`", e.Message, ref)}
}
