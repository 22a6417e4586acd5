package volume

// Orphans: a workflow is recorded for the node that drives it — a job's
// Node, an import's or extend's volume Node, a snapshot's Node while it is
// created or deleted, an export's Job.Node — and only that node runs it:
// at Start, from its watcher when another node handed it over
// (delegate.go), or when it takes a volume's write lease over (adoptJob).
// A node that dies for good, or is taken out by `basalt node remove`,
// would leave its workflows waiting for it: a job on a volume without rw
// attachments has no takeover to adopt it, and while the record holds the
// job the volume refuses every other.
//
// So every node (Config.AdoptOrphans) watches the nodes' liveness keys
// (meta.KeepAlive: a key goes aliveTTL after its node's last renewal, at
// once when the node stops or is removed) and when one goes — also at
// Start, once a minute for deletions a broken watch missed, and when a
// write-lease key goes from under a recorded workflow — adopts the
// workflows recorded for nodes that have none. Each adoption is one
// transaction requiring the dead node's liveness key still absent and the
// record still naming it, so exactly one node adopts each. A workflow
// that changes the volume's live stack goes to the volume's writer, the
// live node holding its write lease, or to the adopting node when nobody
// holds it; the others go to the adopting node. RequestedBy names the dead
// node, so the new node runs it as a delegated one. A snapshot is the
// exception: frozen after another node has written the volume, it would
// hold writes made after it was asked for, so then it fails, as one that
// a restarted node finds in the same case (Start) — and as any snapshot
// under way does when another node takes the volume's write lease
// (failPassedSnapshots), which closes the gap of a node that took the
// lease, wrote and let it go before a sweep came.
//
// Safety: a node whose key went may only be cut off, and still running the
// workflow. Those that write a volume's stack (jobs, extends, snapshot
// freezes, imports) hold its write lease while they do, which the cut-off
// node fences before it can pass (lease.go); a record whose write-lease
// key a gone node still holds is therefore left until that key goes with
// its etcd lease (takeOver then looks again) — adopting it earlier would
// only hand it back. An export writes its object aside and renames it, so
// two runs publish the same bytes; finishing a snapshot's deletion is one
// idempotent transaction. A node that returns finds its records gone and
// records no outcome over the adopter's.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
)

// errAdopted: a node that went on with a workflow found the record no
// longer naming it — another node, which found this one gone, adopted it.
// Nothing is recorded then; the adopter records the outcome.
var errAdopted = errors.New("the workflow was adopted by another node, which found this one gone")

// staleSnapshot ends the message of a snapshot failed because the
// volume's writer changed before it was taken (freezeExact,
// failPassedSnapshots). The record keeps only the message, so it is what
// tells the create call waiting for the snapshot that this failure is the
// foreseeable one, a conflict to answer as such (snapshotFailed), not an
// internal error.
const staleSnapshot = "the snapshot could no longer hold exactly the writes made before it was asked for; take it again"

// orphanSweepEvery is how often a node looks for orphaned workflows
// unasked.
var orphanSweepEvery = time.Minute

// lookForOrphans asks the orphan watcher for a sweep.
func (s *Service) lookForOrphans() {
	select {
	case s.orphanKick <- struct{}{}:
	default: // one is pending already
	}
}

// watchOrphans adopts orphaned workflows now, whenever a node's liveness
// key goes or a sweep is asked for, and every orphanSweepEvery, until ctx
// ends; each sweep also resumes this node's own stranded workflows
// (stranded.go).
func (s *Service) watchOrphans(ctx context.Context) {
	go s.meta.WatchNodesGone(ctx, func(node string) {
		s.logFor("node", node).Info("node gone: looking for its workflows")
		s.lookForOrphans()
	})
	t := time.NewTicker(orphanSweepEvery)
	defer t.Stop()
	for {
		s.adoptOrphans(ctx)
		s.resumeStranded(ctx)
		select {
		case <-ctx.Done():
			return
		case <-s.orphanKick:
		case <-t.C:
		}
	}
}

// adoptOrphans adopts and starts every workflow recorded for a node
// without a liveness key.
func (s *Service) adoptOrphans(ctx context.Context) {
	alive, err := s.meta.Alive(ctx)
	if err != nil {
		s.log.Warn("orphaned workflows: cannot read the nodes' liveness", "err", err)
		return
	}
	gone := func(node string) bool { return node != "" && node != s.cfg.Node && !alive[node] }
	vols, err := s.meta.Volumes(ctx)
	if err != nil {
		s.log.Warn("orphaned workflows: cannot list volumes", "err", err)
		return
	}
	for _, v := range vols {
		var dead string
		var move func(v *meta.Volume, to string) bool
		switch {
		case v.Status == meta.StatusCreating && gone(v.Node): // an import (only they have a record while creating)
			dead = v.Node
			move = func(v *meta.Volume, to string) bool {
				if v.Status != meta.StatusCreating || v.Node != dead {
					return false
				}
				v.Node = to
				if v.Job != nil {
					v.Job.Node, v.Job.RequestedBy = to, dead
				}
				return true
			}
		case v.Status == meta.StatusExtending && gone(v.Node):
			dead = v.Node
			move = func(v *meta.Volume, to string) bool {
				if v.Status != meta.StatusExtending || v.Node != dead {
					return false
				}
				v.Node, v.RequestedBy, v.UpdatedAt = to, dead, now() // new to its driver: not stranded (stranded.go)
				return true
			}
		case v.Job != nil && v.Status != meta.StatusCreating && gone(v.Job.Node):
			dead = v.Job.Node
			move = func(v *meta.Volume, to string) bool {
				if v.Job == nil || v.Job.Node != dead || v.Status == meta.StatusCreating {
					return false
				}
				v.Job.Node, v.Job.RequestedBy = to, dead
				return true
			}
		default:
			continue
		}
		to, ok := s.adopter(ctx, v.ID, alive)
		if !ok {
			continue
		}
		var adopted *meta.Volume
		err := s.meta.Update(ctx, func(tx *meta.Tx) error {
			adopted = nil
			cur, err := tx.Volume(v.ID)
			if err != nil || cur == nil || tx.Alive(dead) || !move(cur, to) {
				return err
			}
			tx.PutVolume(cur)
			adopted = cur
			return nil
		})
		s.adopted("volume", v.ID, dead, to, adopted != nil, err)
		if adopted == nil || to != s.cfg.Node {
			continue // the writer's watcher runs it
		}
		switch adopted.Status {
		case meta.StatusCreating:
			s.startImport(adopted.ID)
		case meta.StatusExtending:
			s.background(func() {
				if _, err := s.runExtend(s.ctx, adopted.ID); err != nil && s.ctx.Err() == nil {
					s.logFor("volume", adopted.ID).Error("adopted extend failed", "err", err)
				}
			})
		default:
			s.startJob(adopted.ID)
		}
	}
	snaps, err := s.meta.Snapshots(ctx)
	if err != nil {
		s.log.Warn("orphaned workflows: cannot list snapshots", "err", err)
		return
	}
	for _, sn := range snaps {
		var dead, to, stale string
		var move func(sn *meta.Snapshot) bool
		switch {
		case (sn.Status == meta.StatusCreating || sn.Status == meta.StatusDeleting) && gone(sn.Node):
			dead, to = sn.Node, s.cfg.Node
			if sn.Status == meta.StatusCreating {
				var ok bool
				if stale, ok = s.freezeExact(ctx, sn.VolumeID, dead, alive); !ok {
					continue
				}
			}
			status := sn.Status
			move = func(sn *meta.Snapshot) bool {
				if sn.Status != status || sn.Node != dead {
					return false
				}
				sn.Node, sn.RequestedBy, sn.UpdatedAt = to, dead, now() // new to its driver: not stranded (stranded.go)
				return true
			}
		case sn.Job != nil && gone(sn.Job.Node): // an export
			dead, to = sn.Job.Node, s.cfg.Node
			move = func(sn *meta.Snapshot) bool {
				if sn.Job == nil || sn.Job.Node != dead {
					return false
				}
				sn.Job.Node, sn.Job.RequestedBy = to, dead
				return true
			}
		default:
			continue
		}
		var adopted *meta.Snapshot
		err := s.meta.Update(ctx, func(tx *meta.Tx) error {
			adopted = nil
			cur, err := tx.Snapshot(sn.ID)
			if err != nil || cur == nil || tx.Alive(dead) || !move(cur) {
				return err
			}
			if stale != "" {
				// Failed in the adoption's own commit: adopted by one and
				// failed by a second, it would be this node's to take
				// (delegate.go) in between, and for good if the second
				// did not commit.
				if err := dropFromVolume(tx, cur.VolumeID, cur.ID); err != nil {
					return err
				}
				cur.Status, cur.StatusMessage, cur.Node = meta.StatusError, stale, ""
			}
			tx.PutSnapshot(cur)
			adopted = cur
			return nil
		})
		s.adopted("snapshot", sn.ID, dead, to, adopted != nil, err)
		if adopted == nil || to != s.cfg.Node {
			continue
		}
		switch {
		case stale != "":
			s.logFor("snapshot", adopted.ID).Error("snapshot workflow failed", "err", stale)
		case adopted.Status == meta.StatusCreating:
			s.background(func() { s.runDelegatedSnapshot(s.ctx, adopted) })
		case adopted.Status == meta.StatusDeleting:
			s.background(func() {
				if err := s.finishDeleteSnapshot(s.ctx, adopted.ID); err != nil && s.ctx.Err() == nil {
					s.logFor("snapshot", adopted.ID).Error("adopted delete failed", "err", err)
				}
			})
		default:
			s.startExport(adopted.ID)
		}
	}
}

// adopter is the node an orphaned workflow that changes volume vol's live
// stack goes to: the live node holding the volume's write lease, or this
// node when none holds it; false while a node that is gone still holds the
// key (it goes with that node's etcd lease, and takeOver asks again).
func (s *Service) adopter(ctx context.Context, vol string, alive map[string]bool) (string, bool) {
	h, err := s.meta.VolumeLeaseHolder(ctx, vol)
	switch {
	case err != nil:
		s.logFor("volume", vol).Warn("orphaned workflow: cannot read the write lease", "err", err)
		return "", false
	case h == nil:
		return s.cfg.Node, true
	case h.Node == s.cfg.Node || alive[h.Node]:
		return h.Node, true
	default:
		return "", false
	}
}

// freezeExact says whether a snapshot of volume vol that node dead did not
// take can still be taken exact — holding the writes acknowledged before
// it was asked for, and no later ones — by the adopting node: only while
// no node holds the volume's write lease (nobody has written it since its
// writer died). Else it returns why it cannot ("": it can), and false
// while the dead node's own write-lease key is still there (it goes with
// that node's etcd lease, and takeOver asks again).
func (s *Service) freezeExact(ctx context.Context, vol, dead string, alive map[string]bool) (string, bool) {
	h, err := s.meta.VolumeLeaseHolder(ctx, vol)
	switch {
	case err != nil:
		s.logFor("volume", vol).Warn("orphaned snapshot: cannot read the write lease", "err", err)
		return "", false
	case h == nil:
		return "", true
	case h.Node != s.cfg.Node && !alive[h.Node]:
		return "", false
	default:
		return fmt.Sprintf("node %s, which was taking this snapshot, is gone, and node %s writes the volume now: "+
			"%s", dead, h.Node, staleSnapshot), true
	}
}

// failPassedSnapshots fails the snapshots of volume vol under way on
// other nodes, as this node takes vol's write lease. A snapshot is frozen
// by the node that held the lease when it was asked for (or that node's
// adopter); once the lease has passed to this node, which is about to
// write, that node could only freeze the volume with writes made after the
// snapshot was asked for. Without this, a node that took the lease, wrote
// and let the lease go again before a sweep came (orphans: freezeExact
// finds nobody writing) or before a node cut off meanwhile returned, would
// leave the snapshot to be taken with its writes in it. Called before the
// acquiring caller writes anything; an error only leaves the snapshot to
// the sweeps, which find this node writing and fail it too.
func (s *Service) failPassedSnapshots(ctx context.Context, vol string) {
	v, err := s.meta.Volume(ctx, vol)
	if err != nil {
		if !errs.IsCode(err, errs.CodeNotFound) {
			s.logFor("volume", vol).Warn("write lease taken: cannot look for snapshots under way", "err", err)
		}
		return
	}
	for _, id := range v.Snapshotting {
		sn, err := s.meta.Snapshot(ctx, id)
		if err != nil || sn.Status != meta.StatusCreating || sn.Node == s.cfg.Node {
			continue
		}
		s.failSnapshot(ctx, id, sn.Node, fmt.Errorf("node %s, which was taking this snapshot, no longer writes the volume: node %s took it over for writing, "+
			"so %s", sn.Node, s.cfg.Node, staleSnapshot))
	}
}

// adopted logs the outcome of one adoption.
func (s *Service) adopted(kind, id, dead, to string, done bool, err error) {
	log := s.logFor(kind, id).With("gone", dead, "to", to)
	switch {
	case err != nil:
		log.Warn("cannot adopt the workflow of a node that is gone", "err", err)
	case done:
		log.Info("adopted the workflow of a node that is gone")
	}
}

// background runs fn in a goroutine Stop waits for.
func (s *Service) background(fn func()) {
	s.jobs.Add(1)
	go func() {
		defer s.jobs.Done()
		fn()
	}()
}
