package volume

// Delegation: the workflows that change a volume's live stack — a
// snapshot's freeze, an extend, a flatten, repair or scrub job — run on
// the node that writes the volume, its write-lease holder (lease.go):
// only that node's open stack is current, and only it can stop the
// volume's writers. A node asked for such a workflow on a volume another
// node writes records it for that node (the snapshot's or volume's Node,
// the job's Node) and waits for the record to change; every node watches
// the records and runs those recorded for it. A claim keeps a node from
// running one workflow twice (its own call and its watcher both see it).

import (
	"context"
	"errors"
	"time"

	"github.com/basalt-storage/basalt/internal/meta"
)

// DefaultDelegateWait bounds how long a call waits for a workflow another
// node runs (Config.DelegateWait); after it the record is returned still
// in its transition (202).
const DefaultDelegateWait = 30 * time.Second

// writer is the node that must run vol's stack workflows: the holder of
// its write lease, or this node when none holds it.
func (s *Service) writer(ctx context.Context, vol string) (string, error) {
	h, err := s.meta.VolumeLeaseHolder(ctx, vol)
	if err != nil {
		return "", err
	}
	if h != nil {
		return h.Node, nil
	}
	return s.cfg.Node, nil
}

// claim marks workflow key as running on this node; false if it already is.
func (s *Service) claim(key string) bool {
	_, taken := s.claims.LoadOrStore(key, true)
	return !taken
}

func (s *Service) unclaim(key string) { s.claims.Delete(key) }

// await polls get until done says the record left its transition, or
// wait passes.
func await[T any](ctx context.Context, wait time.Duration, get func() (T, error), done func(T) bool) (T, error) {
	deadline := time.Now().Add(wait)
	for {
		r, err := get()
		if err != nil || done(r) || time.Now().After(deadline) {
			return r, err
		}
		select {
		case <-ctx.Done():
			return r, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// awaitSnapshot waits until the node a snapshot was delegated to took it.
func (s *Service) awaitSnapshot(ctx context.Context, id string) (*meta.Snapshot, error) {
	return await(ctx, s.cfg.DelegateWait, func() (*meta.Snapshot, error) { return s.meta.Snapshot(ctx, id) },
		func(sn *meta.Snapshot) bool { return sn.Status != meta.StatusCreating })
}

// awaitExtend waits until the node an extend was delegated to did it.
func (s *Service) awaitExtend(ctx context.Context, id string) (*meta.Volume, error) {
	return await(ctx, s.cfg.DelegateWait, func() (*meta.Volume, error) { return s.meta.Volume(ctx, id) },
		func(v *meta.Volume) bool { return v.Status != meta.StatusExtending })
}

// runExtend finishes volume id's extend here unless this node already is.
func (s *Service) runExtend(ctx context.Context, id string) (*meta.Volume, error) {
	if !s.claim("extend/" + id) {
		return s.awaitExtend(ctx, id)
	}
	defer s.unclaim("extend/" + id)
	return s.finishExtend(ctx, id)
}

// delegatedBy: a record whose RequestedBy is by was handed to node self by
// another node. (Records a node made for itself it runs itself, and Start
// resumes them after a crash.)
func delegatedBy(by, self string) bool { return by != "" && by != self }

// delegated runs the workflows other nodes recorded for this node from
// revision from on, until ctx ends.
func (s *Service) delegated(ctx context.Context, from int64) {
	go s.meta.WatchVolumes(ctx, from, func(v *meta.Volume) {
		if v.Status == meta.StatusExtending && v.Node == s.cfg.Node && delegatedBy(v.RequestedBy, s.cfg.Node) {
			if _, err := s.runExtend(ctx, v.ID); errors.Is(err, errAdopted) {
				s.logFor("volume", v.ID).Info("delegated extend finished meanwhile")
			} else if err != nil && ctx.Err() == nil {
				s.logFor("volume", v.ID).Error("delegated extend failed", "err", err)
			}
		}
		if j := v.Job; j != nil && j.Node == s.cfg.Node && delegatedBy(j.RequestedBy, s.cfg.Node) && v.Status != meta.StatusCreating {
			s.startJob(v.ID) // no-op if it runs already
		}
	})
	s.meta.WatchSnapshots(ctx, from, func(sn *meta.Snapshot) {
		if sn.Status == meta.StatusCreating && sn.Node == s.cfg.Node && delegatedBy(sn.RequestedBy, s.cfg.Node) {
			s.runDelegatedSnapshot(ctx, sn)
		}
	})
}

// runDelegatedSnapshot freezes snapshot sn, handed to this node, as the
// volume's writer, unless this node already is.
func (s *Service) runDelegatedSnapshot(ctx context.Context, sn *meta.Snapshot) {
	s.asSnapshotWriter(ctx, sn, func(token int64) {
		if _, err := s.finishSnapshot(ctx, sn.ID, sn.Node, token); errors.Is(err, errAdopted) {
			s.logFor("snapshot", sn.ID).Info("delegated snapshot taken by another node meanwhile")
		} else if err != nil {
			s.logFor("snapshot", sn.ID).Error("delegated snapshot failed", "err", err)
		}
	})
}

// asSnapshotWriter runs fn for snapshot sn, being created for this node,
// as the volume's writer (the write lease's token) with the volume's
// writers stopped — unless a workflow of this node runs on sn already.
// A node that cannot write the volume fails the snapshot.
func (s *Service) asSnapshotWriter(ctx context.Context, sn *meta.Snapshot, fn func(token int64)) {
	if !s.claim("snapshot/" + sn.ID) {
		return
	}
	defer s.unclaim("snapshot/" + sn.ID)
	done, token, err := s.asWriter(ctx, sn.VolumeID)
	if err != nil {
		s.failSnapshot(ctx, sn.ID, sn.Node, err)
		return
	}
	defer done()
	defer s.closeGate(sn.VolumeID)()
	fn(token)
}
