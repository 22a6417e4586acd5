package volume

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"sync"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/nbd"
)

// Exports serves attachments to the NBD server: it resolves an export name
// (the attachment's secret) to the attached volume's data, read-only for ro
// attachments, and closes connections when the attachment goes away.
//
// Revocation: Open registers an export's revocation before it checks that
// the attachment still exists, and Run revokes registered attachments as
// their deletions arrive, so a detach racing with an Open either fails the
// Open or closes its connection. That holds only if Run sees every
// deletion after the revision Open's check read: Open waits until Run has
// taken stock (the revision it watches from), the watch resumes where it
// broke, and when it cannot (compacted history) Run takes stock again,
// revoking what is gone. Detach also revokes at once on the node that
// served it. A TLS connection is also closed once its client certificate
// no longer authenticates (sessions.go).
type Exports struct {
	s *Service
	// Authenticate checks a TLS client certificate chain (user.Service).
	Authenticate func(ctx context.Context, chain []*x509.Certificate) (Caller, error)

	ready     chan struct{} // closed once Run has taken stock and watches
	readyOnce sync.Once

	mu      sync.Mutex
	revoked map[string]chan struct{} // attachment id -> closed on detach
	// writers holds, per volume, one entry for every rw export open here
	// (a connection or an INFO query), removed when it is released: it
	// names the attachments to revoke if this node loses the write lease.
	writers openSet
	// readers holds likewise the ro exports of multiattach volumes open
	// here, revoked when a writer of the volume starts elsewhere or
	// opens a stack of its own here (revokeReaders).
	readers openSet
	// stats holds the request counts of the volumes open here, while
	// counting is on (exportstats.go; nil: off).
	stats map[string]*volumeStats
	// sessions are the TLS connections open here, whose client
	// certificates are checked again while they last (sessions.go).
	sessions map[*session]struct{}
}

// openSet holds, per volume, the exports of a kind open here.
type openSet map[string]map[*opened]struct{}

// opened is one open export of an attachment (see Exports.writers).
type opened struct{ attachment string }

// readyWait bounds how long Open waits for Run to take stock.
const readyWait = 10 * time.Second

// NewExports makes the NBD export resolver of a service; call Run before
// serving with it.
func (s *Service) NewExports(auth func(ctx context.Context, chain []*x509.Certificate) (Caller, error)) *Exports {
	e := &Exports{s: s, Authenticate: auth, ready: make(chan struct{}),
		revoked: map[string]chan struct{}{}, writers: openSet{}, readers: openSet{}}
	s.leases.onLost(e.fenced)
	s.leases.onElsewhere(e.revokeReaders)
	s.exports.Store(e)
	return e
}

// fenced closes the connections of volume vol's rw attachments here: this
// node lost the volume's write lease, and their clients must reconnect
// to the new holder.
func (e *Exports) fenced(vol string) { e.revokeAll(e.writers, vol) }

// revokeReaders closes the connections of volume vol's multiattach ro
// attachments here: they read through a stack that will not see the
// volume's writes — another node took its write lease, or a writer here
// opened a stack of its own (acquireAs) — and their clients must
// reconnect to the writer's (ServingNode).
func (e *Exports) revokeReaders(vol string) { e.revokeAll(e.readers, vol) }

// revokeAll revokes the attachments of the exports of vol in set.
func (e *Exports) revokeAll(set openSet, vol string) {
	e.mu.Lock()
	os := set[vol]
	delete(set, vol)
	e.mu.Unlock()
	for o := range os {
		e.revoke(o.attachment)
	}
}

// add records an export of attachment id on volume vol open here in set;
// drop forgets it when the export is released.
func (e *Exports) add(set openSet, vol, id string) *opened {
	o := &opened{attachment: id}
	e.mu.Lock()
	defer e.mu.Unlock()
	if set[vol] == nil {
		set[vol] = map[*opened]struct{}{}
	}
	set[vol][o] = struct{}{}
	return o
}

func (e *Exports) drop(set openSet, vol string, o *opened) {
	e.mu.Lock()
	defer e.mu.Unlock()
	// After revokeAll the volume's set is gone, or is a new one that
	// does not hold o: nothing to drop then.
	delete(set[vol], o)
	if len(set[vol]) == 0 {
		delete(set, vol)
	}
}

// Run revokes exports as their attachments are deleted, until ctx ends:
// it takes stock (reconcile), then follows deletions from there; when the
// watch cannot resume where it broke, it takes stock again.
func (e *Exports) Run(ctx context.Context) {
	if e.Authenticate != nil {
		go e.recheck(ctx)
	}
	for ctx.Err() == nil {
		rev, err := e.reconcile(ctx)
		if err != nil {
			e.s.log.Warn("nbd exports: cannot list attachments; retrying", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		e.readyOnce.Do(func() { close(e.ready) })
		if err := e.s.meta.WatchAttachmentDeletes(ctx, rev, e.revoke); err != nil {
			e.s.log.Info("nbd exports: attachment watch starts over", "err", err)
		}
	}
}

// reconcile revokes every registered export whose attachment is gone and
// returns the store revision that accounts for: deletions after it are
// the watch's.
func (e *Exports) reconcile(ctx context.Context) (int64, error) {
	live, rev, err := e.s.meta.AttachmentIDs(ctx)
	if err != nil {
		return 0, err
	}
	// Registered after the list: an Open that registers later checks
	// its attachment after the list too, so it sees deletions up to rev.
	e.mu.Lock()
	var absent []string
	for id := range e.revoked {
		if !live[id] {
			absent = append(absent, id)
		}
	}
	e.mu.Unlock()
	for _, id := range absent {
		// Absent from the list, or created after it: ask.
		_, err := e.s.meta.Attachment(ctx, id)
		switch {
		case errs.IsCode(err, errs.CodeNotFound):
			e.s.log.Info("nbd exports: attachment gone while deletions were not watched; revoking", "attachment", id)
			e.revoke(id)
		case err != nil:
			return 0, err
		}
	}
	return rev, nil
}

func (e *Exports) revoke(attachmentID string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if ch, ok := e.revoked[attachmentID]; ok {
		close(ch)
		delete(e.revoked, attachmentID)
	}
}

// revocation returns the channel closed when attachmentID is detached.
func (e *Exports) revocation(attachmentID string) chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	ch, ok := e.revoked[attachmentID]
	if !ok {
		ch = make(chan struct{})
		e.revoked[attachmentID] = ch
	}
	return ch
}

// Open implements nbd.Exports.
func (e *Exports) Open(ctx context.Context, name string, cs *tls.ConnectionState) (*nbd.Export, error) {
	select {
	case <-e.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(readyWait):
		return nil, errs.New(errs.KindUnavailable, errs.CodeMetadataUnavailable,
			"nbd exports: attachment deletions are not watched yet (metadata unavailable?)")
	}
	a, err := e.s.meta.AttachmentByExport(ctx, name)
	if err != nil {
		if errs.IsCode(err, errs.CodeNotFound) {
			return nil, nbd.ErrUnknownExport
		}
		return nil, err
	}
	authed := cs != nil && len(cs.PeerCertificates) > 0 && e.Authenticate != nil
	if authed {
		c, err := e.Authenticate(ctx, cs.PeerCertificates)
		if err != nil {
			return nil, fmt.Errorf("export %s: %w", a.ID, err)
		}
		if !c.sees(a.OwnerID) {
			return nil, nbd.ErrUnknownExport
		}
	}
	// Register for revocation before the final check, so a detach racing
	// with this open either is seen here or closes the connection later.
	revoked := e.revocation(a.ID)
	// Linearizably: a node cut off from the quorum answers from its own
	// copy, which may not know of a detach made through another node —
	// and a detach revokes the export name at once (docs/nbd.md). Such
	// a node opens no new connection until it can tell.
	rctx, ri := meta.WithReadInfo(ctx)
	if _, err := e.s.meta.Attachment(rctx, a.ID); err != nil {
		if errs.IsCode(err, errs.CodeNotFound) {
			e.revoke(a.ID) // gone: nothing may use it (and the registration goes)
		}
		return nil, nbd.ErrUnknownExport
	}
	if ri.Local {
		return nil, errs.New(errs.KindUnavailable, errs.CodeMetadataUnavailable,
			"export %s: no quorum of the metadata cluster answers, so this node cannot tell whether the attachment was detached; connect again once it can", a.ID)
	}
	v, err := e.s.meta.Volume(ctx, a.VolumeID)
	if err != nil {
		return nil, err
	}
	ro := a.Mode == meta.ModeRO
	// Registered before the serving node is checked, so another node
	// taking the write lease after the check still revokes this export.
	var set openSet
	switch {
	case !ro:
		set = e.writers
	case v.Multiattach:
		set = e.readers
	}
	var o *opened
	if set != nil {
		o = e.add(set, v.ID, a.ID)
	}
	unregister := func() {
		if o != nil {
			e.drop(set, v.ID, o)
		}
	}
	var token int64
	if !ro || v.Multiattach {
		// Served by the volume's writer only: a rw attachment always
		// (this node takes the write lease if nobody holds it), an ro
		// one of a multiattach volume while another node writes it
		// (ServingNode).
		var node string
		if ro {
			node, err = e.s.ServingNode(ctx, a)
		} else {
			node, token, err = e.s.leases.acquire(ctx, v.ID)
		}
		if err != nil {
			unregister()
			return nil, fmt.Errorf("export %s: %w", a.ID, err)
		}
		if node != e.s.cfg.Node {
			unregister()
			return nil, errs.New(errs.KindConflict, CodeServedElsewhere,
				"attachment %s is served by node %s, which writes volume %s; ask `basalt attachment show` for its nbd_uri", a.ID, node, v.ID)
		}
	}
	var stack block.Layer
	var release func()
	if !ro {
		stack, release, err = e.s.acquireWriter(v, token)
		switch {
		case errs.IsCode(err, errs.CodeStoreReadOnly):
			// The store's file system is read-only: what it holds is
			// served read-only, the handshake saying so, so that a
			// client can still read the volume and one that would write
			// is told at connect that it cannot.
			e.s.logFor("volume", v.ID).Warn("rw attachment served read-only: the store's file system is read-only", "attachment", a.ID)
			ro = true
		case errs.IsCode(err, errs.CodeNotSupportedByType):
			// A layer of the volume's type serves it read-only: so is
			// the attachment, the handshake saying so.
			ro = true
		}
	}
	if ro {
		stack, release, err = e.s.acquireReader(v)
	}
	if err != nil {
		unregister()
		return nil, err
	}
	stats, dropStats := e.holdStats(v.ID)
	expRevoked, untrack := (<-chan struct{})(revoked), func() {}
	if authed {
		expRevoked, untrack = e.track(cs.PeerCertificates, a.ID, revoked)
	}
	done := func() { release(); unregister(); dropStats(); untrack() }
	var d block.Device = &shared{Device: stack, release: done}
	if !ro {
		gate, dropGate := e.s.gate(a.VolumeID)
		d = &shared{Device: &gated{Device: stack, gate: gate}, release: func() { done(); dropGate() }}
	}
	return &nbd.Export{
		Name:        name,
		LogName:     a.ID,
		Description: fmt.Sprintf("basalt volume %s (attachment %s, %s, host %s)", a.VolumeID, a.ID, a.Mode, a.Host),
		Device:      d,
		ReadOnly:    ro,
		Revoked:     expRevoked,
		Release:     func() { d.Close() },
		Stats:       stats,
	}, nil
}

// shared is one connection's handle on a volume's live stack: closing it
// releases the stack rather than closing it (other connections, jobs and
// snapshots may share it). A read-only attachment's handle is served with
// nbd.Export.ReadOnly, so the server refuses its writes.
type shared struct {
	block.Device
	release func()
}

func (h *shared) Close() error {
	h.release()
	return nil
}

// TryReadAt implements block.NoWaitReader when the stack does.
func (h *shared) TryReadAt(p []byte, off int64) bool { return block.TryReadAt(h.Device, p, off) }

// SpliceTo implements block.Splicer when the stack does.
func (h *shared) SpliceTo(pipe int, off int64, n int, nowait bool) int {
	return block.SpliceTo(h.Device, pipe, off, n, nowait)
}

// SpliceFrom implements block.SpliceWriter when the stack does.
func (h *shared) SpliceFrom(pipe int, off int64, n int) int {
	return block.SpliceFrom(h.Device, pipe, off, n)
}

// gated holds a volume's write gate (read side) around every operation
// that changes data, so that a snapshot, which holds the write side, sees
// exactly the writes acknowledged before it.
type gated struct {
	block.Device
	gate *sync.RWMutex
}

// TryReadAt implements block.NoWaitReader when the stack does: reads do
// not take the gate.
func (g *gated) TryReadAt(p []byte, off int64) bool { return block.TryReadAt(g.Device, p, off) }

// SpliceTo implements block.Splicer when the stack does; reads do not take
// the gate.
func (g *gated) SpliceTo(pipe int, off int64, n int, nowait bool) int {
	return block.SpliceTo(g.Device, pipe, off, n, nowait)
}

// SpliceFrom implements block.SpliceWriter when the stack does, under the
// gate like every write.
func (g *gated) SpliceFrom(pipe int, off int64, n int) int {
	g.gate.RLock()
	defer g.gate.RUnlock()
	return block.SpliceFrom(g.Device, pipe, off, n)
}

func (g *gated) WriteAt(p []byte, off int64, fua bool) error {
	g.gate.RLock()
	defer g.gate.RUnlock()
	return g.Device.WriteAt(p, off, fua)
}

func (g *gated) WriteZeroes(off, n int64, f block.ZeroFlags) error {
	g.gate.RLock()
	defer g.gate.RUnlock()
	return g.Device.WriteZeroes(off, n, f)
}

func (g *gated) Trim(off, n int64, fua bool) error {
	g.gate.RLock()
	defer g.gate.RUnlock()
	return g.Device.Trim(off, n, fua)
}

// Flush holds the gate too: a flush writes metadata (a cow map, checksum
// tables), and a holder giving the lease up waits for it (leases.giveUp).
func (g *gated) Flush() error {
	g.gate.RLock()
	defer g.gate.RUnlock()
	return g.Device.Flush()
}
