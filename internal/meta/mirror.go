package meta

import (
	"context"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"
)

// Mirror is a node-local copy of every record under one prefix, indexed by
// a key of the caller's choosing, kept current by an etcd watch: hot paths
// that resolve a record per request (S3 access keys, bucket owners) read
// it without a round trip to the leader.
//
// A Mirror lags the store by the watch's latency (milliseconds). Callers
// treat a hit as current and a miss as "ask the store": a record created a
// moment ago on another node is found there, and one deleted a moment ago
// may still be served from here for that long.
//
// A record this node has written itself is never served as it was
// before (read-your-writes on the node): Update tells the mirrors of its
// store the revision it committed at, and until the watch has delivered
// that revision every Get is a miss — the caller asks the store.
//
// Invariant: after the first successful list, the map equals the prefix
// as of the last revision applied; a broken watch (compaction, leader
// loss, silence beyond mirrorStall) relists from scratch.
type Mirror[T versioned] struct {
	s      *Store
	prefix string
	mk     func() T
	index  func(T) string
	mu     sync.RWMutex
	byKey  map[string]T // etcd key → record
	byIdx  map[string]T // index(record) → record
	synced bool
	// applied is the revision the maps reflect; own is the latest
	// revision at which this node committed a write under prefix. While
	// applied < own the maps miss a write this node acknowledged.
	applied, own int64
	// changed is closed (and replaced) whenever the maps change.
	changed chan struct{}
	// heartbeat and stall are mirrorHeartbeat and mirrorStall as they
	// were when the mirror started.
	heartbeat, stall time.Duration
}

// Get returns the record whose index is idx; ok is false when the mirror
// has no such record, is not synced yet, or has yet to see a write this
// node made under its prefix.
func (m *Mirror[T]) Get(idx string) (r T, ok bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	r, ok = m.byIdx[idx]
	return r, ok && m.current()
}

// current reports whether the maps answer: synced, and not behind this
// node's own writes. Called with mu held.
func (m *Mirror[T]) current() bool { return m.synced && m.applied >= m.own }

// ownWrites is a Mirror as its store sees it.
type ownWrites interface {
	wrote(rev int64, keys []string)
}

// wrote records that this node changed keys at revision rev.
func (m *Mirror[T]) wrote(rev int64, keys []string) {
	for _, k := range keys {
		if strings.HasPrefix(k, m.prefix) {
			m.mu.Lock()
			if rev > m.own {
				m.own = rev
			}
			m.mu.Unlock()
			return
		}
	}
}

// mirrorsWrote tells the store's mirrors of a commit that changed keys
// at rev (Update; stm.changed).
func (s *Store) mirrorsWrote(rev int64, keys []string) {
	if len(keys) == 0 {
		return
	}
	s.mirrorsMu.Lock()
	defer s.mirrorsMu.Unlock()
	for m := range s.mirrors {
		m.wrote(rev, keys)
	}
}

// Await returns when done holds for what the mirror says of idx (the
// record and whether it has one), or ctx ends: a node that has just
// written a record waits for its own mirror to reflect the write, so that
// its next request reads it back (read-your-writes on that node).
func (m *Mirror[T]) Await(ctx context.Context, idx string, done func(r T, ok bool) bool) error {
	for {
		m.mu.RLock()
		r, ok := m.byIdx[idx]
		ch := m.changed
		// An unsynced mirror answers nothing; one behind this node's
		// own writes answers later.
		fine := !m.synced || m.current() && done(r, ok)
		m.mu.RUnlock()
		if fine {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// notify wakes Await; called with mu held for writing.
func (m *Mirror[T]) notify() {
	close(m.changed)
	m.changed = make(chan struct{})
}

// run lists and watches until ctx ends.
func (m *Mirror[T]) run(ctx context.Context) {
	defer func() {
		m.s.mirrorsMu.Lock()
		delete(m.s.mirrors, m)
		m.s.mirrorsMu.Unlock()
	}()
	for ctx.Err() == nil {
		rev, err := m.load(ctx)
		if err == nil {
			m.watch(ctx, rev)
		}
		m.mu.Lock()
		m.synced = false
		m.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (m *Mirror[T]) load(ctx context.Context) (int64, error) {
	lctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := m.s.cli.Get(lctx, m.prefix, clientv3.WithPrefix())
	if err != nil {
		return 0, err
	}
	byKey, byIdx := map[string]T{}, map[string]T{}
	for _, kv := range resp.Kvs {
		r := m.mk()
		if decode(string(kv.Key), kv.Value, r) != nil {
			continue // a corrupt record is reported by the direct reads
		}
		byKey[string(kv.Key)] = r
		if idx := m.index(r); idx != "" {
			byIdx[idx] = r
		}
	}
	m.mu.Lock()
	m.byKey, m.byIdx, m.synced, m.applied = byKey, byIdx, true, resp.Header.Revision
	m.notify()
	m.mu.Unlock()
	return resp.Header.Revision, nil
}

// mirrorHeartbeat is how often a mirror asks its watch for a progress
// notification; mirrorStall is how long a watch may stay silent (no
// event, no progress) before the mirror takes it for stalled and lists
// again. A watch can stall without an error: its stream's connection dead
// but not yet found so (keepalives take seconds), or its server not
// sending. Without this bound a mirror would go on answering from what it
// last heard — a user deleted since would still authenticate on this node.
var mirrorHeartbeat, mirrorStall = 2 * time.Second, 6 * time.Second

func (m *Mirror[T]) watch(ctx context.Context, rev int64) {
	// WithRequireLeader: a member cut off from the leader ends the watch,
	// so the mirror stops answering (synced false) instead of going stale.
	//
	// etcd answers a progress request only once every watch on the
	// request's stream has reached the store's revision. So the watch
	// starts at the listed revision itself, not the one after (which an
	// idle store never reaches: no progress, a relist every mirrorStall),
	// re-applying that revision's events, which the list already holds
	// (applying an event twice leaves the maps as once). And it gets a
	// stream of its own (streams are told apart by their outgoing
	// metadata): the client's other watches start where they please.
	wctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(
		clientv3.WithRequireLeader(ctx), "basalt-mirror", m.prefix))
	defer cancel()
	// etcd's client opens a watch only over a connection, and its Watch
	// call waits for one: a store lost between the list and the watch
	// would keep the mirror answering from its list for as long as the
	// partition lasts. Opening counts against the stall bound too; past
	// it, the watch is given up (Watch returns a closed channel).
	opening := time.AfterFunc(m.stall, cancel)
	wch := m.s.cli.Watch(wctx, m.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev))
	if !opening.Stop() && ctx.Err() == nil {
		m.s.log.Warn("metadata mirror: its watch could not be opened; listing again", "prefix", m.prefix, "waited", m.stall.String())
		return
	}
	beat := time.NewTicker(m.heartbeat)
	defer beat.Stop()
	heard := time.Now()
	for {
		var resp clientv3.WatchResponse
		select {
		case r, ok := <-wch:
			if !ok || r.Err() != nil {
				return
			}
			resp, heard = r, time.Now()
		case <-beat.C:
			if silent := time.Since(heard); silent > m.stall {
				m.s.log.Warn("metadata mirror: its watch went silent; listing again", "prefix", m.prefix, "silent", silent.Round(time.Millisecond).String())
				return
			}
			// The progress request goes to the stream of wctx's
			// metadata, which a derived context keeps; it is bounded, as
			// a stalled stream may not take it.
			pctx, pcancel := context.WithTimeout(wctx, m.heartbeat)
			m.s.cli.RequestProgress(pctx)
			pcancel()
			continue
		}
		if len(resp.Events) == 0 {
			continue // a progress notification
		}
		m.mu.Lock()
		for _, ev := range resp.Events {
			// Events come in revision order, a revision's all at once.
			m.applied = ev.Kv.ModRevision
			key := string(ev.Kv.Key)
			if old, ok := m.byKey[key]; ok {
				delete(m.byIdx, m.index(old))
				delete(m.byKey, key)
			}
			if ev.Type == clientv3.EventTypePut {
				r := m.mk()
				if decode(key, ev.Kv.Value, r) == nil {
					m.byKey[key] = r
					if idx := m.index(r); idx != "" {
						m.byIdx[idx] = r
					}
				}
			}
		}
		m.notify()
		m.mu.Unlock()
	}
}

// MirrorBuckets mirrors the bucket records, by name, until ctx ends.
func (s *Store) MirrorBuckets(ctx context.Context) *Mirror[*Bucket] {
	return startMirror(ctx, s, prefixBuckets, func() *Bucket { return &Bucket{} },
		func(b *Bucket) string { return b.Name })
}

// MirrorUsersByAccessKey mirrors the users, by S3 access key id, until ctx
// ends.
func (s *Store) MirrorUsersByAccessKey(ctx context.Context) *Mirror[*User] {
	return startMirror(ctx, s, prefixUsers, func() *User { return &User{} },
		func(u *User) string { return u.AccessKeyID })
}

// MirrorUsersByName mirrors the users, by name, until ctx ends.
func (s *Store) MirrorUsersByName(ctx context.Context) *Mirror[*User] {
	return startMirror(ctx, s, prefixUsers, func() *User { return &User{} },
		func(u *User) string { return u.Name })
}

func startMirror[T versioned](ctx context.Context, s *Store, prefix string, mk func() T, index func(T) string) *Mirror[T] {
	m := &Mirror[T]{s: s, prefix: prefix, mk: mk, index: index, changed: make(chan struct{}),
		heartbeat: mirrorHeartbeat, stall: mirrorStall}
	s.mirrorsMu.Lock()
	if s.mirrors == nil {
		s.mirrors = map[ownWrites]bool{}
	}
	s.mirrors[m] = true
	s.mirrorsMu.Unlock()
	go m.run(ctx)
	return m
}
