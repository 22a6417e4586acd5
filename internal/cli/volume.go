package cli

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/basalt-storage/basalt/internal/api"
	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/client"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/size"
	"github.com/spf13/cobra"
)

func parseSize(s string) (int64, error) {
	n, err := size.Parse(s)
	if err != nil {
		return 0, errs.Invalid(errs.CodeInvalidSize, "--size: %v", err)
	}
	return n, nil
}

func volumeCmd(g *globals) *cobra.Command {
	cmd := group("volume", "manage block volumes")
	var req api.CreateVolumeRequest
	var sz string
	var wait bool
	create := &cobra.Command{
		Use:   "create --size SIZE [--name N] [--type T] [--from-snapshot SNAPSHOT | --from-object s3://B/K [--wait]] [--multiattach]",
		Short: "create a volume (empty, from a snapshot, or from a raw image object)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if sz == "" && req.FromSnapshot == "" && req.FromObject == "" {
				return errs.Invalid(errs.CodeInvalidSize, "--size is required (e.g. 10GiB) unless --from-snapshot or --from-object is given")
			}
			if sz != "" {
				n, err := parseSize(sz)
				if err != nil {
					return err
				}
				req.Size = api.Size(n)
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			v, err := c.CreateVolume(ctx(), req)
			if err != nil {
				return err
			}
			if v.Progress != nil {
				if !wait {
					followHint(g, v.Progress.Job+" of volume "+v.ID, "basalt volume show "+v.ID, true)
				} else if v, err = waitJob(g, c, v.ID); err != nil {
					return err
				}
			}
			return g.emit(v, func(w *tabwriter.Writer) { volumeTable(w, v) })
		},
	}
	f := create.Flags()
	f.StringVar(&sz, "size", "", "size: 512MiB, 10GiB, 1TiB, 10G or bytes")
	f.StringVar(&req.Name, "name", "", "name, unique among your volumes")
	f.StringVar(&req.Type, "type", "", "volume type (default standard)")
	f.StringVar(&req.FromSnapshot, "from-snapshot", "", "create from this snapshot (id or name)")
	f.StringVar(&req.FromObject, "from-object", "", "fill from this raw image object, s3://BUCKET/KEY (size: the object's)")
	f.BoolVar(&wait, "wait", false, "with --from-object: wait until the volume is filled, showing progress")
	f.BoolVar(&req.Multiattach, "multiattach", false, "allow several read-write attachments")
	f.StringVar(&req.ClientToken, "client-token", "", "idempotency token: repeating a create with it returns the first result")

	list := &cobra.Command{
		Use: "list", Short: "list volumes", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			vs, err := c.Volumes(ctx())
			if err != nil {
				return err
			}
			return g.emit(vs, func(w *tabwriter.Writer) {
				fmt.Fprintln(w, "ID\tNAME\tSIZE\tSTATUS\tTYPE\tOWNER\tCREATED")
				for _, v := range vs {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", v.ID, dash(v.Name), size.Format(v.SizeBytes), v.Status, v.Type, v.Owner, v.CreatedAt.Format("2006-01-02 15:04:05"))
				}
			})
		},
	}
	show := &cobra.Command{
		Use: "show ID_OR_NAME", Short: "show a volume", Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			v, err := c.Volume(ctx(), args[0])
			if err != nil {
				return err
			}
			return g.emit(v, func(w *tabwriter.Writer) { volumeTable(w, v) })
		},
	}
	del := &cobra.Command{
		Use: "delete ID_OR_NAME", Short: "delete a volume and its data", Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if err := c.DeleteVolume(ctx(), args[0]); err != nil {
				return err
			}
			return g.emit(map[string]string{"deleted": args[0]}, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "deleted volume %s\n", args[0])
			})
		},
	}
	var extSize string
	var extWait bool
	extend := &cobra.Command{
		Use: "extend ID_OR_NAME --size SIZE [--wait=false]", Short: "grow a volume", Args: exactArgs(1),
		Long: `Grow a volume to SIZE, its new total size. The command returns when the volume has
its new size. A volume that another node writes is extended by that node; should it not have
finished within the API's 30 s (the API answers 202, the volume still extending), the command
waits for it, unless --wait=false: it then returns at once, the volume still extending, and
says how to follow the extend. Ctrl-C stops the waiting, not the extend.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if extSize == "" {
				return errs.Invalid(errs.CodeInvalidSize, "--size is required: the new total size, larger than the current one (e.g. 20GiB)")
			}
			n, err := parseSize(extSize)
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			v, err := c.ExtendVolume(ctx(), args[0], n)
			if err != nil {
				return err
			}
			// Still extending: the API's 202, the extend handed on to the
			// volume's writer. The call is synchronous by contract, and
			// exit 0 with the old size read as done (a script went on
			// to grow the file system).
			if v.Status == "extending" {
				if !extWait {
					followHint(g, fmt.Sprintf("extend of volume %s to %s", v.ID, size.Format(n)), "basalt volume show "+v.ID, false)
				} else if v, err = waitExtend(g, c, v.ID, n); err != nil {
					return err
				}
			}
			return g.emit(v, func(w *tabwriter.Writer) { volumeTable(w, v) })
		},
	}
	extend.Flags().StringVar(&extSize, "size", "", "new size, larger than the current one: 512MiB, 10GiB, 1TiB, 10G or bytes")
	extend.Flags().BoolVar(&extWait, "wait", true, "if another node runs the extend and the API stops waiting for it (202), keep waiting until it ends; --wait=false returns at once")
	cmd.AddCommand(create, list, show, del, extend,
		jobCmd(g, "flatten", "copy every block a snapshot provides into the volume, so it depends on none"),
		jobCmd(g, "repair", "rebuild failed mirror or parity legs (only what changed when a leg returns)"),
		jobCmd(g, "scrub", "verify every block against its checksum, repairing from a good copy"))
	return cmd
}

// jobCmd is `volume flatten|repair|scrub ID [--wait]`.
func jobCmd(g *globals, job, short string) *cobra.Command {
	var wait bool
	cmd := &cobra.Command{
		Use: job + " ID_OR_NAME [--wait]", Short: short, Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			v, err := c.VolumeJob(ctx(), args[0], job)
			if err != nil {
				return err
			}
			if !wait {
				followHint(g, job+" of volume "+v.ID, "basalt volume show "+v.ID, true)
			} else if v, err = waitJob(g, c, v.ID); err != nil {
				return err
			}
			return g.emit(v, func(w *tabwriter.Writer) { volumeTable(w, v) })
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until the job ends, showing progress; fail if it fails")
	return cmd
}

func volumeTable(w *tabwriter.Writer, v *api.Volume) {
	fmt.Fprintf(w, "id:\t%s\nname:\t%s\nsize:\t%s (%d bytes)\nstatus:\t%s\n", v.ID, dash(v.Name), size.Format(v.SizeBytes), v.SizeBytes, v.Status)
	if v.StatusMessage != "" {
		fmt.Fprintf(w, "message:\t%s\n", v.StatusMessage)
	}
	progressLine(w, v.Progress)
	if v.SourceObject != "" {
		fmt.Fprintf(w, "from object:\t%s\n", v.SourceObject)
	}
	if j := v.LastJob; j != nil {
		outcome := "ok"
		if j.Error != "" {
			outcome = "failed: " + j.Error
		}
		if j.Report != nil {
			b, _ := json.Marshal(j.Report)
			outcome += " " + string(b)
		}
		fmt.Fprintf(w, "last job:\t%s %s (%s)\n", j.Job, outcome, j.FinishedAt.Format(time.RFC3339))
	}
	fmt.Fprintf(w, "type:\t%s\nowner:\t%s\nmultiattach:\t%v\nsource snapshot:\t%s\ncreated:\t%s\n",
		v.Type, v.Owner, v.Multiattach, dash(v.SourceSnapshot), v.CreatedAt.Format(time.RFC3339))
	if len(v.Attachments) == 0 {
		fmt.Fprintf(w, "attachments:\t-\n")
	}
	for i, a := range v.Attachments {
		label := ""
		if i == 0 {
			label = "attachments:"
		}
		fmt.Fprintf(w, "%s\t%s %s on %s %s\n", label, a.ID, a.Mode, a.Host, a.NBDURI)
	}
	if v.Stack != nil {
		stackTree(w, *v.Stack, "stack:", 0)
	}
}

// stackTree prints a layer tree, one layer per line, children indented.
func stackTree(w *tabwriter.Writer, n block.Node, label string, depth int) {
	line := strings.Repeat("  ", depth) + n.Type + " " + n.State
	if n.Progress != nil {
		line += fmt.Sprintf(" %.1f%%", *n.Progress)
	}
	if n.Path != "" {
		line += " " + n.Path
	}
	fmt.Fprintf(w, "%s\t%s\n", label, line)
	for _, c := range n.Children {
		stackTree(w, c, "", depth+1)
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// waitJob polls until the volume's job ends, drawing progress.
func waitJob(g *globals, c *client.Client, id string) (*api.Volume, error) {
	ctx, stop := waiting()
	defer stop()
	bar := newProgressBar(g.stderr)
	job, follow := "job of volume "+id, "basalt volume show "+id
	for {
		v, err := c.Volume(ctx, id)
		if err != nil {
			bar.finish(false)
			return nil, waitFailed(ctx, err, job, follow)
		}
		if v.Progress == nil {
			j := v.LastJob
			failed := (j != nil && j.Error != "") || v.Status == "error"
			bar.finish(!failed)
			if j != nil && j.Error != "" {
				return v, errs.New(errs.KindInternal, "JobFailed", "%s of volume %s failed: %s", j.Job, v.ID, j.Error)
			}
			if v.Status == "error" {
				return v, errs.New(errs.KindInternal, "VolumeFailed", "volume %s failed: %s", v.ID, v.StatusMessage)
			}
			return v, nil
		}
		bar.draw(v.Progress)
		job = v.Progress.Job + " of volume " + id
		if !pause(ctx) {
			bar.finish(false)
			return nil, waitFailed(ctx, nil, job, follow)
		}
	}
}

// waitExtend polls until the extend of volume id to newSize, which
// another node runs (the API answered 202), ends.
func waitExtend(g *globals, c *client.Client, id string, newSize int64) (*api.Volume, error) {
	ctx, stop := waiting()
	defer stop()
	job, follow := fmt.Sprintf("extend of volume %s to %s", id, size.Format(newSize)), "basalt volume show "+id
	fmt.Fprintf(g.stderr, "the volume's writer, another node, is still running the %s; waiting for it (Ctrl-C stops the waiting, not the extend)\n", job)
	for {
		if !pause(ctx) {
			return nil, waitFailed(ctx, nil, job, follow)
		}
		v, err := c.Volume(ctx, id)
		if err != nil {
			return nil, waitFailed(ctx, err, job, follow)
		}
		switch {
		case v.Status == "extending":
			continue
		case v.SizeBytes >= newSize:
			return v, nil
		case v.Status == "error":
			return v, errs.New(errs.KindInternal, "VolumeFailed", "volume %s failed: %s", v.ID, v.StatusMessage)
		}
		// Back at rest at a smaller size: the extend failed there, and
		// the volume says why.
		why := v.StatusMessage
		if why == "" {
			why = "the volume kept its size " + size.Format(v.SizeBytes)
		}
		return v, errs.New(errs.KindInternal, "JobFailed", "the %s failed: %s", job, why)
	}
}
