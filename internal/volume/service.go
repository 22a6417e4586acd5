package volume

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"math"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/lock"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/store"
)

// Caller is the authenticated identity a request acts for.
type Caller struct {
	Name string
	// ID is the user record's id. Ownership is by id, not name, so that a
	// user created again under a deleted user's name inherits nothing.
	ID    string
	Admin bool
}

func (c Caller) sees(ownerID string) bool { return c.Admin || c.ID == ownerID }

// owned is a record a user owns.
type owned interface{ OwnedBy() string }

// fetchVisible reads a record with get and reports it, missing or not the
// caller's, as the same NotFound: existence must not leak.
func fetchVisible[T owned](c Caller, what, ref string, get func() (T, error)) (T, error) {
	r, err := get()
	if err != nil {
		var zero T
		if errs.IsCode(err, errs.CodeNotFound) {
			return zero, errs.NotFound(what, ref)
		}
		return zero, err
	}
	if !c.sees(r.OwnedBy()) {
		var zero T
		return zero, errs.NotFound(what, ref)
	}
	return r, nil
}

// Config tunes a Service.
type Config struct {
	// Node is this node's name; it is recorded on workflows it drives.
	Node string
	// Overcommit is how far thin provisioning may promise beyond the
	// store's capacity: provisioned bytes <= capacity × Overcommit.
	Overcommit float64
	// Keys wraps the data keys of encrypted volumes (the cluster key).
	Keys block.Keys
	// ImageGrace spares unreferenced copy-on-write images younger than it
	// from collection (0: DefaultImageGrace; negative: none).
	ImageGrace time.Duration
	// AdoptAll makes Start resume workflows recorded by any node, not only
	// this one: right for a single-member cluster where no other node
	// exists. Only Start: other nodes may join right after (the sweeps
	// for stranded workflows run this node's only).
	AdoptAll bool
	// Objects is the object store snapshots are exported to and volumes
	// made from (bridge.go); nil: this node serves none.
	Objects Objects
	// AdoptOrphans makes Start watch the nodes' liveness keys and adopt
	// the workflows of nodes that are gone (orphans.go). Every node of a
	// cluster must then keep its own key (meta.KeepAlive), as a server
	// does.
	AdoptOrphans bool
	// DelegateWait bounds how long a call waits for a workflow delegated
	// to the node that writes the volume (0: DefaultDelegateWait).
	DelegateWait time.Duration
}

// DefaultOvercommit is the default thin-provisioning ratio.
const DefaultOvercommit = 2.0

// Service is the volume and snapshot service of one node.
type Service struct {
	meta  *meta.Store
	store *store.Store
	cfg   Config
	log   *slog.Logger

	ctx    context.Context // lives as long as the service; cancels jobs
	cancel context.CancelFunc
	jobs   sync.WaitGroup

	// gates serialise snapshots against writers of the same volume: a
	// snapshot holds the write side while it freezes the top image, so it
	// holds exactly the writes acknowledged before it. The NBD data path
	// takes the read side.
	gates keyed[sync.RWMutex]

	// liveMu guards live, briefly: a stack is built, flushed and closed
	// under its volume's lock in openMus only (lockOpen), so a slow open
	// or close of one volume (a file system that stalls, a long chain)
	// holds up no other. Order: that lock before liveMu.
	liveMu  sync.Mutex
	live    map[string]*liveStack // volume id -> open stack
	openMus keyed[sync.Mutex]

	// gcMu keeps this node's image collection apart from its own creation
	// of images (volumes, clones, snapshots), which hold it for reading:
	// they do not wait for one another, and wait for a collection only
	// while it lists (stacks.go, collect).
	gcMu sync.RWMutex
	gc   *collector // background image collection (collector.go)
	// collapseScans shares the whole-store reads of the collapse jobs
	// deciding at the same time (collapse.go, needed).
	collapseScans *sharedScan[*collapseScan]

	leases *leases  // write leases of volumes (lease.go)
	claims sync.Map // workflows running on this node (delegate.go)
	// orphanKick asks for a sweep for orphaned workflows (orphans.go).
	orphanKick chan struct{}
	// exports serves this node's NBD connections (export.go); Detach
	// revokes through it at once. Nil until NewExports.
	exports atomic.Pointer[Exports]

	lockMu sync.Mutex // workflow locks (locks.go)
	lockr  *lock.Locker
}

// New makes a service; call Start before serving.
func New(m *meta.Store, st *store.Store, cfg Config, log *slog.Logger) *Service {
	if cfg.Overcommit <= 0 {
		cfg.Overcommit = DefaultOvercommit
	}
	if cfg.ImageGrace == 0 {
		cfg.ImageGrace = DefaultImageGrace
	}
	if cfg.DelegateWait <= 0 {
		cfg.DelegateWait = DefaultDelegateWait
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Service{meta: m, store: st, cfg: cfg, log: log, ctx: ctx, cancel: cancel,
		live:       map[string]*liveStack{},
		orphanKick: make(chan struct{}, 1)}
	s.leases = newLeases(s)
	s.leases.onLost(s.dropLive)
	s.gc = newCollector()
	s.collapseScans = newSharedScan(ctx, s.scanForCollapse, s.background)
	s.jobs.Add(2)
	go func() {
		defer s.jobs.Done()
		s.runCollector()
	}()
	go func() {
		defer s.jobs.Done()
		s.runLegProbe()
	}()
	return s
}

// Stop cancels running jobs and waits for them. Their records stay in their
// transitional status; the next Start resumes them.
func (s *Service) Stop() {
	s.cancel()
	s.jobs.Wait()
	// The writes under way on the volumes this node writes end before
	// their leases go (leases.stop revokes them: another node may write
	// at once), as when one lease is given up (leases.giveUp): the NBD
	// server's shutdown stops waiting for requests still in their device
	// after a while, and one stalled in the file system would land after
	// the next holder's writes. Later ones wait, then find their stacks
	// fenced.
	for _, vol := range s.leases.heldVolumes() {
		defer s.closeGate(vol)()
	}
	s.liveMu.Lock()
	defer s.liveMu.Unlock()
	for id, ls := range s.live {
		if err := ls.l.Flush(); err != nil {
			s.logFor("volume", id).Warn("flush at stop", "err", err)
		}
		ls.l.Close()
		ls.forget()
		delete(s.live, id)
	}
	s.leases.stop()
	s.lockMu.Lock()
	if s.lockr != nil {
		s.lockr.Close()
	}
	s.lockMu.Unlock()
}

// gate returns the write gate of a volume (see Service.gates) and drop,
// to be called once the gate is no longer used.
func (s *Service) gate(volumeID string) (g *sync.RWMutex, drop func()) {
	return s.gates.get(volumeID)
}

// closeGate takes volume vol's write gate for writing — its writers wait
// until reopen is called.
func (s *Service) closeGate(vol string) (reopen func()) {
	g, drop := s.gate(vol)
	g.Lock()
	return func() {
		g.Unlock()
		drop()
	}
}

// MaxOvercommit bounds Config.Overcommit: a thousand times the store is
// no limit in practice, and keeps the product of any store's size in an
// int64.
const MaxOvercommit = 1000.0

// Limit is the provisioning limit in bytes.
func (s *Service) Limit() (int64, error) {
	c, err := s.store.Capacity()
	if err != nil {
		return 0, err
	}
	return s.limit(c.TotalBytes), nil
}

// limit is total bytes overcommitted, saturated at the largest int64 (a
// float64 beyond it converts to the smallest).
func (s *Service) limit(total int64) int64 {
	l := float64(total) * s.cfg.Overcommit
	if !(l < math.MaxInt64) { // NaN too
		return math.MaxInt64
	}
	return int64(l)
}

// Capacity reports the store's provisioning state.
type Capacity struct {
	store.Capacity
	Overcommit       float64 `json:"overcommit"`
	LimitBytes       int64   `json:"limit_bytes"`
	ProvisionedBytes int64   `json:"provisioned_bytes"`
}

// Capacity reads capacity and the provisioned total.
func (s *Service) Capacity(ctx context.Context) (*Capacity, error) {
	c, err := s.store.Capacity()
	if err != nil {
		return nil, err
	}
	p, err := s.meta.Provisioned(ctx)
	if err != nil {
		return nil, err
	}
	return &Capacity{Capacity: c, Overcommit: s.cfg.Overcommit,
		LimitBytes: s.limit(c.TotalBytes), ProvisionedBytes: p}, nil
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// checkName validates an optional resource name. Names may not look like ids
// so that "show ID_OR_NAME" is never ambiguous.
func checkName(name string) error {
	if name == "" {
		return nil
	}
	if !nameRE.MatchString(name) {
		return errs.Invalid(errs.CodeInvalidName, "name %q is not valid: use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit", name)
	}
	if volumeIDRE.MatchString(name) || snapshotIDRE.MatchString(name) {
		return errs.Invalid(errs.CodeInvalidName, "name %q looks like an id; choose another", name)
	}
	return nil
}

var (
	volumeIDRE   = regexp.MustCompile(`^vol-[0-9a-f]{16}$`)
	snapshotIDRE = regexp.MustCompile(`^snap-[0-9a-f]{16}$`)
)

func newID(prefix string) string {
	b := make([]byte, 8)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// checkToken validates an idempotency token.
func checkToken(t string) error {
	if len(t) > 128 || !tokenRE.MatchString(t) && t != "" {
		return errs.Invalid(errs.CodeInvalidRequest, "client_token must be 1-128 letters, digits, '.', '_' or '-'")
	}
	return nil
}

// fingerprint condenses a create request's parameters for idempotency
// checks: as resolved, with defaults applied (an omitted size or type
// counts as the one it defaults to; docs/api.md, "Idempotency").
func fingerprint(params ...any) string {
	b, _ := json.Marshal(params) // plain values: cannot fail
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:8])
}

// tokenMismatch is the error for a token reused with different parameters.
func tokenMismatch(token, id string) error {
	return errs.Conflict(errs.CodeIdempotentMismatch, "client token %q was already used to create %s with different parameters", token, id)
}

// hostRE accepts host names and IP addresses (an attachment's host is a
// label the operator chooses; it is shown, not resolved).
var hostRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9.:_-]{0,252}$`)

var tokenRE = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

func now() time.Time { return time.Now().UTC().Truncate(time.Millisecond) }

// resting is the status a volume returns to when a transition ends.
func resting(v *meta.Volume) string {
	if len(v.Attachments) > 0 {
		return meta.StatusInUse
	}
	return meta.StatusAvailable
}

func (s *Service) logFor(kind, id string) *slog.Logger {
	return s.log.With(kind, id, "node", s.cfg.Node)
}

// detach returns the context for the rest of a workflow call from the
// transaction that records the workflow on: the caller's values, but not
// its cancellation — a caller that goes away (a client disconnecting, a
// request timeout) must not leave a recorded workflow half done, its
// record transitional (refusing every other workflow on it, its bytes
// provisioned) until the node restarts, nor make its recording commit
// ambiguous. It ends with the service instead: Stop interrupts the
// workflow, and the next Start finishes it. Call the cancel function when
// the call ends.
func (s *Service) detach(ctx context.Context) (context.Context, context.CancelFunc) {
	d, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(s.ctx, cancel)
	return d, func() {
		stop()
		cancel()
	}
}
