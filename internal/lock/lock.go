// Package lock is basalt's cluster-wide lock service: named resources locked
// in read, update or write mode (the modes of seed 004, table 1), kept in
// etcd, every grant carrying a fencing token.
//
// # Job
//
// A workflow that spans several metadata transactions and data operations
// (snapshot a volume, delete it, ...) may run on any node; the lock keeps two
// such workflows on one resource from interleaving. A snapshot takes update
// (readers of the volume go on; a second snapshot or a delete waits), a
// delete takes write. The update mode exists so that a workflow can do its
// preparatory reads without shutting readers out and Upgrade to write only for
// the part that modifies (seed 004: "a transaction first applies an update
// lock, without blocking other read requests, then upgrades to write mode
// only when operations modifying local objects are ready to be submitted").
//
// Compatibility (ok = may be held together):
//
//	         read   update  write
//	read     ok     ok      -
//	update   ok     -       -
//	write    -      -       -
//
// # Who calls it
//
// Workflows in the service packages (volume; wired by their owners), through
// one Locker per node built on the node's etcd session and meta.LocksPrefix.
// Storage that is written under a lock is handed the holder's Token and
// refuses a token older than the newest it has seen for that resource.
//
// # How
//
// Every request (holder or waiter) is one key
// <prefix><escaped resource>/<lease>-<random>, created with the session's
// lease and carrying its mode. The keys of a resource form a queue ordered by
// their etcd create revision. A request is granted when no earlier key of the
// queue conflicts with its mode: it is then compatible with every holder and
// passes no conflicting waiter, so a stream of readers cannot starve a writer.
// A waiter watches the newest earlier key that conflicts and looks again when
// that key changes.
//
// Upgrade rewrites the update holder's own key to write mode (so it keeps its
// place: every update or write request behind it stays behind it) and then
// waits until the readers admitted beside it, or queued ahead of it, have
// gone. Which readers those
// are must be exact: a reader whose key is newer than an update key admits
// itself with a transaction that also checks that the update key has not been
// modified since it looked, recording "admitted" in its own key. The upgrade's
// rewrite and that check cannot both succeed, so a reader is either recorded
// as admitted before the upgrade (and the upgrade waits for it) or sees the
// write mode and waits (see DESIGN NOTES in upgrade.go).
//
// # Invariants
//
//  1. Any two holders of a resource are compatible (an upgrading update
//     holder counts as update until its readers have gone).
//  2. Requests are granted in queue order among those that conflict.
//  3. Token is the create revision of the holder's key. If holder B is granted
//     after holder A released and their modes conflict, A.Token < B.Token. The
//     one exception is harmless: a reader admitted beside an update holder that
//     later upgrades has a newer token than the writer it preceded; readers do
//     not write, so fencing writes is unaffected.
//  4. A holder's key lives on its session's lease: if the node dies, its locks
//     vanish when the lease expires (the session TTL), and waiters behind them
//     proceed. A holder learns that it lost its lock from Held.Lost.
package lock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"sort"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Mode is a lock mode.
type Mode int

// The modes of seed 004, table 1.
const (
	Read Mode = iota + 1
	Update
	Write
)

func (m Mode) String() string {
	switch m {
	case Read:
		return "read"
	case Update:
		return "update"
	case Write:
		return "write"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// ParseMode is the inverse of String.
func ParseMode(s string) (Mode, error) {
	for m := Read; m <= Write; m++ {
		if s == m.String() {
			return m, nil
		}
	}
	return 0, fmt.Errorf("unknown lock mode %q", s)
}

func (m Mode) valid() bool { return m >= Read && m <= Write }

// Compatible reports whether holders in modes m and o may coexist: read with
// read, read with update; nothing else.
func (m Mode) Compatible(o Mode) bool {
	switch m {
	case Read:
		return o == Read || o == Update
	case Update:
		return o == Read
	}
	return false
}

var (
	// ErrConflict is matched (errors.Is) by every *ConflictError.
	ErrConflict = errors.New("lock conflict")
	// ErrLost means the request's key is gone: its session's lease expired
	// (or was revoked) or somebody deleted it. Whatever it protected was, at
	// some point, no longer protected.
	ErrLost = errors.New("lock lost (session expired or key deleted)")
	// ErrNotUpdate is returned by Upgrade on a holder not in update mode.
	ErrNotUpdate = errors.New("only an update holder can upgrade")
	// ErrReleased is returned by Upgrade on a released holder.
	ErrReleased = errors.New("lock already released")
)

// Holder describes one request in a resource's queue.
type Holder struct {
	Key   string
	Owner string
	Mode  Mode
	Token int64
	Lease clientv3.LeaseID
	// Waiting: the request is queued behind a conflicting one. For an
	// update holder upgrading to write, Mode is Write and Waiting is true
	// while readers it waits for (ahead of it in the queue, or admitted
	// beside it before the upgrade) are still there; such an admitted
	// reader holds the lock.
	Waiting bool
}

func (h Holder) String() string {
	state := "holds"
	if h.Waiting {
		state = "waits for"
	}
	return fmt.Sprintf("%s %s %s (token %d)", h.Owner, state, h.Mode, h.Token)
}

// ConflictError is the refusal of TryAcquire and TryUpgrade. Blockers are
// the requests in the way, holders and earlier waiters, oldest first.
type ConflictError struct {
	Resource string
	Mode     Mode
	Blockers []Holder
}

func (e *ConflictError) Error() string {
	parts := make([]string, len(e.Blockers))
	for i, b := range e.Blockers {
		parts[i] = b.String()
	}
	return fmt.Sprintf("lock %q: %s refused: %s", e.Resource, e.Mode, strings.Join(parts, ", "))
}

// Is makes errors.Is(err, ErrConflict) true.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// Options tune a Locker.
type Options struct {
	// Owner names this node in conflicts and in the keys' values (default
	// host name and pid).
	Owner string
	// Log receives debug records of waits and warnings of failed cleanups
	// (default slog.Default()).
	Log *slog.Logger
}

// Locker takes locks for one etcd session. It is safe for concurrent use;
// one per node is enough.
type Locker struct {
	cli    *clientv3.Client
	sess   *concurrency.Session
	prefix string
	owner  string
	log    *slog.Logger
}

// New returns a Locker whose keys live under prefix (meta.LocksPrefix in
// production) on sess's lease. The session's TTL is how long a dead node's
// locks outlive it.
func New(sess *concurrency.Session, prefix string, o Options) *Locker {
	if o.Owner == "" {
		host, _ := os.Hostname()
		o.Owner = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return &Locker{cli: sess.Client(), sess: sess, prefix: prefix, owner: o.Owner, log: o.Log}
}

// Open starts an etcd session of ttl seconds on cli and returns a Locker on
// it; Close ends the session (and frees its locks). ctx bounds the grant of
// the session's lease only (etcd's client would wait for a reachable
// member without end); the session lives until Close or its lease ends.
func Open(ctx context.Context, cli *clientv3.Client, prefix string, ttl int, o Options) (*Locker, error) {
	grant, err := cli.Grant(ctx, int64(ttl))
	if err != nil {
		return nil, fmt.Errorf("lock session: %w", err)
	}
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(ttl), concurrency.WithLease(grant.ID))
	if err != nil {
		return nil, fmt.Errorf("lock session: %w", err)
	}
	return New(sess, prefix, o), nil
}

// Done is closed when the Locker's session ends (closed, or its lease
// expired: every lock it held is gone).
func (l *Locker) Done() <-chan struct{} { return l.sess.Done() }

// Close ends the session: every lock taken through it is released.
func (l *Locker) Close() error { return l.sess.Close() }

// queuePrefix is the key range of a resource's queue. The resource is
// path-escaped so that it holds no "/": one resource's range never contains
// another's keys.
func (l *Locker) queuePrefix(resource string) string { return QueuePrefix(l.prefix, resource) }

// QueuePrefix is the key range of resource's queue under a Locker's prefix:
// empty when nobody holds or waits for the resource.
func QueuePrefix(prefix, resource string) string {
	return prefix + url.PathEscape(resource) + "/"
}

func (l *Locker) newKey(resource string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s%x-%s", l.queuePrefix(resource), int64(l.sess.Lease()), hex.EncodeToString(b[:]))
}

// record is the value of a queue key.
type record struct {
	Mode  string `json:"mode"`
	Owner string `json:"owner,omitempty"`
	// Admitted: a reader newer than some update key recorded that it was
	// granted (see upgrade.go); an upgrade waits for it.
	Admitted bool `json:"admitted,omitempty"`
	// Upgraded: an update holder rewrote its key to write mode.
	Upgraded bool `json:"upgraded,omitempty"`
}

func (r record) encode() string {
	b, _ := json.Marshal(r)
	return string(b)
}

// entry is a parsed queue key.
type entry struct {
	key    string
	create int64
	mod    int64
	lease  int64
	mode   Mode
	rec    record
}

func (e entry) holder(waiting bool) Holder {
	return Holder{Key: e.key, Owner: e.rec.Owner, Mode: e.mode, Token: e.create,
		Lease: clientv3.LeaseID(e.lease), Waiting: waiting}
}

// parseQueue turns a range read of a queue into entries in queue order.
func parseQueue(kvs []*mvccpb.KeyValue) ([]entry, error) {
	q := make([]entry, 0, len(kvs))
	for _, kv := range kvs {
		var r record
		if err := json.Unmarshal(kv.Value, &r); err != nil {
			return nil, fmt.Errorf("lock key %s: bad value: %w", kv.Key, err)
		}
		m, err := ParseMode(r.Mode)
		if err != nil {
			return nil, fmt.Errorf("lock key %s: %w", kv.Key, err)
		}
		q = append(q, entry{key: string(kv.Key), create: kv.CreateRevision, mod: kv.ModRevision,
			lease: kv.Lease, mode: m, rec: r})
	}
	sort.Slice(q, func(i, j int) bool { return q[i].create < q[j].create })
	return q, nil
}

// verdict is what a request's queue says about it.
type verdict struct {
	self entry
	// blockers: earlier entries whose mode conflicts with self's, oldest
	// first. The request waits while there is any.
	blockers []entry
	// fence: for a reader, the earlier update entries. A reader behind an
	// update key is granted only by recording Admitted in a transaction
	// that checks these entries are unmodified (an upgrade modifies one).
	fence []entry
	// granted: no blockers and, for a reader with a fence, Admitted.
	granted bool
}

// decide is the grant rule, a pure function of the queue.
func decide(q []entry, key string) (verdict, bool) {
	i := 0
	for i < len(q) && q[i].key != key {
		i++
	}
	if i == len(q) {
		return verdict{}, false
	}
	v := verdict{self: q[i]}
	for _, e := range q[:i] {
		switch {
		case !v.self.mode.Compatible(e.mode):
			v.blockers = append(v.blockers, e)
		case v.self.mode == Read && e.mode == Update:
			v.fence = append(v.fence, e)
		}
	}
	v.granted = len(v.blockers) == 0 && (len(v.fence) == 0 || v.self.rec.Admitted)
	return v, true
}

// describe lists a queue as Holders, marking who waits.
func describe(q []entry) []Holder {
	out := make([]Holder, len(q))
	for i, e := range q {
		out[i] = e.holder(waits(q, e))
	}
	return out
}

// waits says whether the request e of queue q is waiting. The grant rule
// alone (decide) answers wrongly during an upgrade: the upgraded key is in
// write mode, so decide would call a reader admitted beside it waiting (it
// holds the lock: admission records a grant, and only an upgrade after it
// can put a conflicting key ahead of it) and the upgrader holding (it
// waits for that reader), and Queue and ConflictError would name the wrong
// request as the one in the way.
func waits(q []entry, e entry) bool {
	switch {
	case e.mode == Read && e.rec.Admitted:
		return false
	case e.rec.Upgraded:
		// An upgrader waits for the readers ahead of it and those admitted
		// beside it, as beginUpgrade's drain does.
		for _, o := range q {
			if o.key != e.key && o.mode == Read && (o.create < e.create || o.rec.Admitted) {
				return true
			}
		}
		return false
	}
	v, _ := decide(q, e.key)
	return len(v.blockers) > 0
}

// Queue returns the requests on resource, oldest first: a snapshot for
// operators and error messages, stale as soon as it is returned.
func (l *Locker) Queue(ctx context.Context, resource string) ([]Holder, error) {
	resp, err := l.cli.Get(ctx, l.queuePrefix(resource), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("lock %q: read queue: %w", resource, err)
	}
	q, err := parseQueue(resp.Kvs)
	if err != nil {
		return nil, fmt.Errorf("lock %q: %w", resource, err)
	}
	return describe(q), nil
}

// Acquire queues a request for resource in mode and blocks until it is
// granted or ctx is done (then the request leaves the queue). Once the
// Locker's session has ended (Done closed) it fails with an error wrapping
// ErrLost: a new Locker is needed.
func (l *Locker) Acquire(ctx context.Context, resource string, mode Mode) (*Held, error) {
	w, err := l.enqueue(ctx, resource, mode)
	if err != nil {
		return nil, err
	}
	err = w.admitAll(ctx)
	for err == nil && !w.granted {
		l.log.Debug("lock: waiting", "resource", resource, "mode", mode, "token", w.token,
			"behind", w.watchKey)
		if err = l.sleep(ctx, w.watchKey, w.watchRev); err == nil {
			if err = w.poll(ctx); err == nil {
				err = w.admitAll(ctx)
			}
		}
	}
	if err != nil {
		w.abandon(ctx)
		return nil, fmt.Errorf("lock %q: acquire %s: %w", resource, mode, err)
	}
	l.log.Debug("lock: granted", "resource", resource, "mode", mode, "token", w.token)
	return w.held(), nil
}

// TryAcquire is Acquire without the wait: a request that would have to wait
// leaves the queue at once and the answer is a *ConflictError naming the
// requests in its way.
func (l *Locker) TryAcquire(ctx context.Context, resource string, mode Mode) (*Held, error) {
	w, err := l.enqueue(ctx, resource, mode)
	if err != nil {
		return nil, err
	}
	if err := w.admitAll(ctx); err != nil {
		w.abandon(ctx)
		return nil, fmt.Errorf("lock %q: try %s: %w", resource, mode, err)
	}
	if !w.granted {
		w.abandon(ctx)
		return nil, w.conflict()
	}
	return w.held(), nil
}

// waiter is a queued request. Acquire drives it: look at the queue
// (evaluate), admit itself if it is a reader behind update keys, else sleep
// until the watched key changes and look again (poll). The model test
// drives the same methods one step at a time.
type waiter struct {
	l        *Locker
	resource string
	prefix   string
	key      string
	mode     Mode
	token    int64
	granted  bool
	// admitting: a reader that found nothing in its way but update keys
	// (fence, as they were when it looked); admit records its admission.
	admitting bool
	fence     []entry
	self      record
	// When neither: the requests in the way (oldest first) and the key to
	// watch for changes after watchRev (the newest of them).
	blockers []entry
	queue    []entry
	watchKey string
	watchRev int64
}

// enqueue creates the request's key and evaluates the queue it joined, in
// one round trip.
func (l *Locker) enqueue(ctx context.Context, resource string, mode Mode) (*waiter, error) {
	if resource == "" {
		return nil, errors.New("lock: empty resource name")
	}
	if !mode.valid() {
		return nil, fmt.Errorf("lock %q: invalid mode %d", resource, mode)
	}
	// A session whose keepalives have stopped may still have its lease on
	// the server for up to a TTL: a key put on it would be granted already
	// lost (Held.Lost closed) and keep other nodes out until the lease
	// expires. Refuse instead; the caller needs a new session.
	select {
	case <-l.sess.Done():
		return nil, fmt.Errorf("lock %q: queue %s request: session ended: %w", resource, mode, ErrLost)
	default:
	}
	w := &waiter{l: l, resource: resource, prefix: l.queuePrefix(resource), key: l.newKey(resource), mode: mode}
	rec := record{Mode: mode.String(), Owner: l.owner}
	resp, err := l.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(w.key), "=", 0)).
		Then(clientv3.OpPut(w.key, rec.encode(), clientv3.WithLease(l.sess.Lease())),
			clientv3.OpGet(w.prefix, clientv3.WithPrefix())).
		Commit()
	if err != nil {
		// The put may have been applied even though the call failed — or
		// may be applied later (sweepLate).
		w.abandon(ctx)
		l.sweepLate(resource, w.key)
		return nil, fmt.Errorf("lock %q: queue %s request: %w", resource, mode, err)
	}
	if !resp.Succeeded {
		return nil, fmt.Errorf("lock %q: request key %s already exists", resource, w.key)
	}
	w.token = resp.Header.Revision
	if err := w.evaluate(resp.Responses[1].GetResponseRange().Kvs, resp.Header.Revision); err != nil {
		w.abandon(ctx)
		return nil, fmt.Errorf("lock %q: %s request: %w", resource, mode, err)
	}
	return w, nil
}

// evaluate applies the grant rule to a snapshot of the queue taken at rev:
// granted, admitting, or blocked (with what to watch).
func (w *waiter) evaluate(kvs []*mvccpb.KeyValue, rev int64) error {
	q, err := parseQueue(kvs)
	if err != nil {
		return err
	}
	v, ok := decide(q, w.key)
	if !ok {
		return ErrLost
	}
	w.queue, w.granted, w.admitting, w.fence, w.blockers = q, false, false, nil, nil
	switch {
	case len(v.blockers) > 0:
		w.blockers = v.blockers
		w.watchKey, w.watchRev = v.blockers[len(v.blockers)-1].key, rev
	case v.granted:
		w.granted = true
	default:
		w.admitting, w.fence, w.self = true, v.fence, v.self.rec
	}
	return nil
}

// admit records a reader's admission, unless one of the update keys it
// passes changed (was upgraded) since it looked; then it evaluates the
// queue as it is now, which the failed transaction returns.
func (w *waiter) admit(ctx context.Context) error {
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(w.key), "=", w.token)}
	for _, f := range w.fence {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(f.key), "=", f.mod))
	}
	rec := w.self
	rec.Admitted = true
	resp, err := w.l.cli.Txn(ctx).If(cmps...).
		Then(clientv3.OpPut(w.key, rec.encode(), clientv3.WithIgnoreLease())).
		Else(clientv3.OpGet(w.prefix, clientv3.WithPrefix())).
		Commit()
	if err != nil {
		return fmt.Errorf("admit reader: %w", err)
	}
	if resp.Succeeded {
		w.granted, w.admitting, w.fence = true, false, nil
		return nil
	}
	return w.evaluate(resp.Responses[0].GetResponseRange().Kvs, resp.Header.Revision)
}

// admitAll admits until granted or blocked.
func (w *waiter) admitAll(ctx context.Context) error {
	for w.admitting {
		if err := w.admit(ctx); err != nil {
			return err
		}
	}
	return nil
}

// poll reads the queue again and evaluates it.
func (w *waiter) poll(ctx context.Context) error {
	resp, err := w.l.cli.Get(ctx, w.prefix, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("read queue: %w", err)
	}
	return w.evaluate(resp.Kvs, resp.Header.Revision)
}

func (w *waiter) conflict() *ConflictError {
	all := describe(w.queue)
	e := &ConflictError{Resource: w.resource, Mode: w.mode}
	for _, b := range w.blockers {
		for _, h := range all {
			if h.Key == b.key {
				e.Blockers = append(e.Blockers, h)
			}
		}
	}
	return e
}

// abandon takes the request out of the queue, even when ctx is already
// done. Should that fail too, it is retried in the background.
func (w *waiter) abandon(ctx context.Context) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if _, err := w.l.cli.Delete(cctx, w.key); err != nil {
		w.l.deleteLater(err, w.resource, w.key)
	}
}

func (w *waiter) held() *Held {
	return &Held{l: w.l, resource: w.resource, prefix: w.prefix, key: w.key, token: w.token, mode: w.mode}
}
