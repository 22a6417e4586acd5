package cli

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/basalt-storage/basalt/internal/api"
	"github.com/basalt-storage/basalt/internal/client"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/size"
	"github.com/spf13/cobra"
)

func snapshotCmd(g *globals) *cobra.Command {
	cmd := group("snapshot", "manage snapshots")
	var req api.CreateSnapshotRequest
	var createWait bool
	create := &cobra.Command{
		Use: "create VOLUME [--name N] [--wait=false]", Short: "snapshot a volume (instant: copy-on-write)", Args: exactArgs(1),
		Long: `Snapshot a volume. The command returns when the snapshot is available. A volume that
another node writes is frozen by that node; should it not have taken the snapshot within the
API's 30 s (the API answers 202, the snapshot still creating), the command waits for it,
unless --wait=false: it then returns at once, the snapshot still creating, and says how to
follow it. Ctrl-C stops the waiting, not the snapshot.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			req.Volume = args[0]
			c, err := g.client()
			if err != nil {
				return err
			}
			sn, err := c.CreateSnapshot(ctx(), req)
			if err != nil {
				return err
			}
			// Still creating: the API's 202, the snapshot handed on to
			// the volume's writer. As for extend: synchronous by
			// contract, so exit 0 must mean taken.
			if sn.Status == "creating" {
				if !createWait {
					followHint(g, "snapshot "+sn.ID+" of volume "+sn.VolumeID, "basalt snapshot show "+sn.ID, false)
				} else if sn, err = waitSnapshot(g, c, sn.ID); err != nil {
					return err
				}
			}
			return g.emit(sn, func(w *tabwriter.Writer) { snapshotTable(w, sn) })
		},
	}
	create.Flags().StringVar(&req.Name, "name", "", "name, unique among your snapshots")
	create.Flags().StringVar(&req.ClientToken, "client-token", "", "idempotency token: repeating a create with it returns the first result")
	create.Flags().BoolVar(&createWait, "wait", true, "if another node takes the snapshot and the API stops waiting for it (202), keep waiting until it is taken; --wait=false returns at once")
	var volume string
	list := &cobra.Command{
		Use: "list [--volume V]", Short: "list snapshots", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ss, err := c.Snapshots(ctx(), volume)
			if err != nil {
				return err
			}
			return g.emit(ss, func(w *tabwriter.Writer) {
				fmt.Fprintln(w, "ID\tNAME\tVOLUME\tSIZE\tSTATUS\tOWNER\tCREATED")
				for _, s := range ss {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, dash(s.Name), s.VolumeID, size.Format(s.SizeBytes), s.Status, s.Owner, s.CreatedAt.Format("2006-01-02 15:04:05"))
				}
			})
		},
	}
	list.Flags().StringVar(&volume, "volume", "", "only snapshots of this volume")
	show := &cobra.Command{
		Use: "show ID_OR_NAME", Short: "show a snapshot", Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			sn, err := c.Snapshot(ctx(), args[0])
			if err != nil {
				return err
			}
			return g.emit(sn, func(w *tabwriter.Writer) { snapshotTable(w, sn) })
		},
	}
	del := &cobra.Command{
		Use: "delete ID_OR_NAME", Short: "delete a snapshot", Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if err := c.DeleteSnapshot(ctx(), args[0]); err != nil {
				return err
			}
			return g.emit(map[string]string{"deleted": args[0]}, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "deleted snapshot %s\n", args[0])
			})
		},
	}
	var to string
	var wait bool
	export := &cobra.Command{
		Use:   "export SNAPSHOT --to s3://BUCKET/KEY [--wait]",
		Short: "write a snapshot as a raw image object (a job; reflinked where the file system can)",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if to == "" {
				return errs.Invalid(errs.CodeInvalidRequest, "--to s3://BUCKET/KEY is required")
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			sn, err := c.ExportSnapshot(ctx(), args[0], api.ExportSnapshotRequest{To: to})
			if err != nil {
				return err
			}
			if !wait {
				followHint(g, "export of snapshot "+sn.ID, "basalt snapshot show "+sn.ID, true)
			} else if sn, err = waitExport(g, c, sn.ID); err != nil {
				return err
			}
			return g.emit(sn, func(w *tabwriter.Writer) { snapshotTable(w, sn) })
		},
	}
	export.Flags().StringVar(&to, "to", "", "the object to write, s3://BUCKET/KEY (a bucket of yours)")
	export.Flags().BoolVar(&wait, "wait", false, "wait until the export ends, showing progress; fail if it fails")
	cmd.AddCommand(create, list, show, del, export)
	return cmd
}

// waitExport polls until the snapshot's export ends, drawing progress.
func waitExport(g *globals, c *client.Client, id string) (*api.Snapshot, error) {
	ctx, stop := waiting()
	defer stop()
	bar := newProgressBar(g.stderr)
	job, follow := "export of snapshot "+id, "basalt snapshot show "+id
	for {
		sn, err := c.Snapshot(ctx, id)
		if err != nil {
			bar.finish(false)
			return nil, waitFailed(ctx, err, job, follow)
		}
		if sn.Progress == nil {
			failed := sn.LastJob != nil && sn.LastJob.Error != ""
			bar.finish(!failed)
			if failed {
				return sn, errs.New(errs.KindInternal, "JobFailed", "export of snapshot %s failed: %s", sn.ID, sn.LastJob.Error)
			}
			return sn, nil
		}
		bar.draw(sn.Progress)
		if !pause(ctx) {
			bar.finish(false)
			return nil, waitFailed(ctx, nil, job, follow)
		}
	}
}

// waitSnapshot polls until snapshot id, which another node takes (the
// API answered 202), is no longer creating.
func waitSnapshot(g *globals, c *client.Client, id string) (*api.Snapshot, error) {
	ctx, stop := waiting()
	defer stop()
	job, follow := "snapshot "+id, "basalt snapshot show "+id
	fmt.Fprintf(g.stderr, "the volume's writer, another node, has not taken %s yet; waiting for it (Ctrl-C stops the waiting, not the snapshot)\n", job)
	for {
		if !pause(ctx) {
			return nil, waitFailed(ctx, nil, job, follow)
		}
		sn, err := c.Snapshot(ctx, id)
		if err != nil {
			return nil, waitFailed(ctx, err, job, follow)
		}
		switch sn.Status {
		case "creating":
			continue
		case "available":
			return sn, nil
		}
		why := sn.StatusMessage
		if why == "" {
			why = "it is " + sn.Status
		}
		return sn, errs.New(errs.KindInternal, "JobFailed", "snapshot %s of volume %s was not taken: %s", sn.ID, sn.VolumeID, why)
	}
}

func snapshotTable(w *tabwriter.Writer, s *api.Snapshot) {
	fmt.Fprintf(w, "id:\t%s\nname:\t%s\nvolume:\t%s\nsize:\t%s (%d bytes)\nstatus:\t%s\n", s.ID, dash(s.Name), s.VolumeID, size.Format(s.SizeBytes), s.SizeBytes, s.Status)
	if s.StatusMessage != "" {
		fmt.Fprintf(w, "message:\t%s\n", s.StatusMessage)
	}
	fmt.Fprintf(w, "owner:\t%s\ncreated:\t%s\n", s.Owner, s.CreatedAt.Format(time.RFC3339))
	progressLine(w, s.Progress)
	if j := s.LastJob; j != nil {
		outcome := "ok"
		if j.Error != "" {
			outcome = "failed: " + j.Error
		}
		fmt.Fprintf(w, "last job:\t%s %s (%s)\n", j.Job, outcome, j.FinishedAt.Format(time.RFC3339))
	}
}
