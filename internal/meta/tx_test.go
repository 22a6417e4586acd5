package meta

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestClaimName(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	owner, other := uniq("owner"), uniq("owner")
	name := uniq("data")

	claim := func(kind, owner, name, id string) error {
		return s.Update(ctx, func(tx *Tx) error { return tx.ClaimName(kind, owner, name, id) })
	}
	lookup := func(kind, owner, name string) string {
		t.Helper()
		id, err := s.LookupName(ctx, kind, owner, name)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}

	if got := lookup(NameVolume, owner, name); got != "" {
		t.Fatalf("unclaimed name resolves to %q", got)
	}
	if err := claim(NameVolume, owner, name, "vol-1"); err != nil {
		t.Fatal(err)
	}
	if got := lookup(NameVolume, owner, name); got != "vol-1" {
		t.Fatalf("LookupName = %q, want vol-1", got)
	}
	// Claiming again for the same id is idempotent (a retried create).
	if err := claim(NameVolume, owner, name, "vol-1"); err != nil {
		t.Fatalf("reclaim by the holder: %v", err)
	}
	// Another id conflicts.
	err := claim(NameVolume, owner, name, "vol-2")
	e, ok := errs.As(err)
	if !ok || e.Code != errs.CodeNameConflict || e.Kind != errs.KindConflict {
		t.Fatalf("conflicting claim: %v, want NameConflict", err)
	}
	if !strings.Contains(e.Message, "vol-1") || !strings.Contains(e.Message, name) {
		t.Errorf("conflict message %q should name the holder and the name", e.Message)
	}
	// Names are per owner and per kind.
	if err := claim(NameVolume, other, name, "vol-3"); err != nil {
		t.Fatalf("same name, other owner: %v", err)
	}
	if err := claim(NameSnapshot, owner, name, "snap-1"); err != nil {
		t.Fatalf("same name, other kind: %v", err)
	}
	// Inside a transaction, NameOwner sees the claim.
	if err := s.Update(ctx, func(tx *Tx) error {
		if got := tx.NameOwner(NameVolume, owner, name); got != "vol-1" {
			t.Errorf("NameOwner = %q", got)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Releasing by a non-holder does nothing.
	if err := s.Update(ctx, func(tx *Tx) error { tx.ReleaseName(NameVolume, owner, name, "vol-2"); return nil }); err != nil {
		t.Fatal(err)
	}
	if got := lookup(NameVolume, owner, name); got != "vol-1" {
		t.Fatalf("release by non-holder freed the name: %q", got)
	}
	// Releasing by the holder frees it for anyone.
	if err := s.Update(ctx, func(tx *Tx) error { tx.ReleaseName(NameVolume, owner, name, "vol-1"); return nil }); err != nil {
		t.Fatal(err)
	}
	if got := lookup(NameVolume, owner, name); got != "" {
		t.Fatalf("released name still resolves to %q", got)
	}
	if err := claim(NameVolume, owner, name, "vol-2"); err != nil {
		t.Fatalf("claim after release: %v", err)
	}
	// The other owner's and other kind's claims were untouched.
	if lookup(NameVolume, other, name) != "vol-3" || lookup(NameSnapshot, owner, name) != "snap-1" {
		t.Fatal("release touched another owner's or kind's name")
	}
}

func TestClaimNameEmptyAndInvalid(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	owner := uniq("owner")
	// An empty name claims nothing and never conflicts.
	for _, id := range []string{"vol-a", "vol-b"} {
		if err := s.Update(ctx, func(tx *Tx) error { return tx.ClaimName(NameVolume, owner, "", id) }); err != nil {
			t.Fatalf("empty name: %v", err)
		}
	}
	resp, err := s.cli.Get(ctx, prefixNames+NameVolume+"/"+owner+"/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Count != 0 {
		t.Fatalf("empty names wrote %d keys", resp.Count)
	}
	// A name or owner that would change the key's structure is refused.
	for _, c := range []struct{ owner, name string }{
		{owner, "a/b"}, {owner, "../x"}, {owner, "nul\x00"}, {"own/er", "x"}, {"", "x"},
	} {
		err := s.Update(ctx, func(tx *Tx) error { return tx.ClaimName(NameVolume, c.owner, c.name, "vol-x") })
		if !errs.IsCode(err, errs.CodeInvalidName) {
			t.Errorf("ClaimName(owner %q, name %q) = %v, want InvalidName", c.owner, c.name, err)
		}
		if id, err := s.LookupName(ctx, NameVolume, c.owner, c.name); err != nil || id != "" {
			t.Errorf("LookupName(owner %q, name %q) = %q, %v; want \"\", nil", c.owner, c.name, id, err)
		}
	}
}

// TestClaimNameRace: ten transactions race to claim one name for different
// ids; serializable transactions let exactly one win, the others see it.
func TestClaimNameRace(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	owner, name := uniq("owner"), uniq("race")
	const n = 10
	results := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i] = s.Update(ctx, func(tx *Tx) error {
				// Read something else first so that transactions overlap.
				tx.Provisioned()
				return tx.ClaimName(NameVolume, owner, name, "vol-"+string(rune('a'+i)))
			})
		}()
	}
	close(start)
	wg.Wait()
	winners := 0
	winner := ""
	for i, err := range results {
		switch {
		case err == nil:
			winners++
			winner = "vol-" + string(rune('a'+i))
		case errs.IsCode(err, errs.CodeNameConflict):
		default:
			t.Errorf("goroutine %d: %v", i, err)
		}
	}
	if winners != 1 {
		t.Fatalf("%d transactions claimed the name, want exactly 1", winners)
	}
	if got, _ := s.LookupName(ctx, NameVolume, owner, name); got != winner {
		t.Fatalf("name bound to %q, winner was %q", got, winner)
	}
}

func TestProvision(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	base, err := s.Provisioned(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Within the limit: applied.
	if err := s.Update(ctx, func(tx *Tx) error { return tx.Provision(1000, base+1000) }); err != nil {
		t.Fatalf("provision up to the limit: %v", err)
	}
	if got, _ := s.Provisioned(ctx); got != base+1000 {
		t.Fatalf("provisioned = %d, want %d", got, base+1000)
	}
	// Beyond the limit: InsufficientCapacity, and nothing of the transaction
	// is written (not even writes made before Provision failed).
	id := uniq("vol")
	err = s.Update(ctx, func(tx *Tx) error {
		tx.PutVolume(&Volume{ID: id, Owner: "x", OwnerID: "x", SizeBytes: 1, Status: StatusCreating})
		if err := tx.ClaimName(NameVolume, "x", id, id); err != nil {
			return err
		}
		return tx.Provision(1, base+1000)
	})
	e, ok := errs.As(err)
	if !ok || e.Code != errs.CodeInsufficientCapacity || e.Kind != errs.KindInsufficientStorage {
		t.Fatalf("over the limit: %v, want InsufficientCapacity", err)
	}
	if got, _ := s.Provisioned(ctx); got != base+1000 {
		t.Fatalf("failed provision changed the counter to %d", got)
	}
	if _, err := s.Volume(ctx, id); !errs.IsCode(err, errs.CodeNotFound) {
		t.Fatalf("record written by a failed transaction: %v", err)
	}
	if got, _ := s.LookupName(ctx, NameVolume, "x", id); got != "" {
		t.Fatalf("name claimed by a failed transaction: %q", got)
	}
	// Giving back never needs capacity and never goes below zero.
	if err := s.Update(ctx, func(tx *Tx) error { return tx.Provision(-1000, 0) }); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Provisioned(ctx); got != base {
		t.Fatalf("provisioned = %d after giving back, want %d", got, base)
	}
	// A zero delta is fine even at limit 0.
	if err := s.Update(ctx, func(tx *Tx) error { return tx.Provision(0, 0) }); err != nil {
		t.Fatal(err)
	}
	if err := s.Update(ctx, func(tx *Tx) error { return tx.Provision(-(base + 5000), 0) }); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Provisioned(ctx); got != 0 {
		t.Fatalf("provisioned = %d after giving back more than held, want 0", got)
	}
	if base > 0 {
		s.Update(ctx, func(tx *Tx) error { return tx.Provision(base, math.MaxInt64) })
	}
}

// TestProvisionRace: concurrent reservations never exceed the limit.
func TestProvisionRace(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	base, err := s.Provisioned(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const n, each, room = 10, 10, 50
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok, full := 0, 0
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := s.Update(ctx, func(tx *Tx) error { return tx.Provision(each, base+room) })
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errs.IsCode(err, errs.CodeInsufficientCapacity):
				full++
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if ok != room/each || full != n-room/each {
		t.Fatalf("%d reservations succeeded and %d were refused; want %d and %d", ok, full, room/each, n-room/each)
	}
	if got, _ := s.Provisioned(ctx); got != base+room {
		t.Fatalf("provisioned = %d, want %d", got, base+room)
	}
	if err := s.Update(ctx, func(tx *Tx) error { return tx.Provision(-room, 0) }); err != nil {
		t.Fatal(err)
	}
}

// TestProvisionOverflow: Provision's contract is that a positive delta fails
// when the total would exceed limit. cur+delta is computed in int64, so a
// delta near MaxInt64 wraps negative, passes the check, and the "if next < 0"
// clamp then silently resets the counter to 0, forgetting every
// reservation. volume.Service.CreateVolume/ExtendVolume pass caller-chosen
// sizes up to MaxInt64 (they do not enforce size.Max themselves).
//
// Product bug: internal/meta/tx.go Provision (the check "cur+delta > limit").
// Fix: compare "delta > limit-cur" (no overflow for cur, limit >= 0), or
// refuse delta > size.Max.
func TestProvisionOverflow(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	if err := s.Update(ctx, func(tx *Tx) error { return tx.Provision(4096, math.MaxInt64) }); err != nil {
		t.Fatal(err)
	}
	before, _ := s.Provisioned(ctx)
	t.Cleanup(func() {
		now, _ := s.Provisioned(context.Background())
		s.Update(context.Background(), func(tx *Tx) error { return tx.Provision(before-4096-now, math.MaxInt64) })
	})
	err := s.Update(ctx, func(tx *Tx) error { return tx.Provision(math.MaxInt64-511, 1<<40) })
	after, _ := s.Provisioned(ctx)
	if !errs.IsCode(err, errs.CodeInsufficientCapacity) {
		t.Errorf("Provision(MaxInt64-511, limit 1 TiB) with %d already provisioned = %v; want InsufficientCapacity", before, err)
	}
	if after != before {
		t.Errorf("provisioned counter went from %d to %d", before, after)
	}
}

func TestTokens(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	owner, other := uniq("owner"), uniq("owner")
	get := func(kind, owner, tok string) string {
		t.Helper()
		var id string
		if err := s.Update(ctx, func(tx *Tx) error { id = tx.TokenOwner(kind, owner, tok); return nil }); err != nil {
			t.Fatal(err)
		}
		return id
	}
	if got := get(NameVolume, owner, "t1"); got != "" {
		t.Fatalf("unknown token resolves to %q", got)
	}
	if err := s.Update(ctx, func(tx *Tx) error {
		tx.PutToken(NameVolume, owner, "t1", "vol-1")
		tx.PutToken(NameVolume, owner, "", "vol-9") // no token: nothing recorded
		if got := tx.TokenOwner(NameVolume, owner, "t1"); got != "vol-1" {
			t.Errorf("token not visible inside its transaction: %q", got)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := get(NameVolume, owner, "t1"); got != "vol-1" {
		t.Fatalf("TokenOwner = %q, want vol-1", got)
	}
	if got := get(NameVolume, owner, ""); got != "" {
		t.Fatalf("empty token resolves to %q", got)
	}
	if got := get(NameVolume, other, "t1"); got != "" {
		t.Fatalf("tokens leak across owners: %q", got)
	}
	// Tokens are per kind: the same token may name a snapshot too, and
	// neither binding disturbs the other.
	if got := get(NameSnapshot, owner, "t1"); got != "" {
		t.Fatalf("tokens leak across kinds: %q", got)
	}
	if err := s.Update(ctx, func(tx *Tx) error { tx.PutToken(NameSnapshot, owner, "t1", "snap-1"); return nil }); err != nil {
		t.Fatal(err)
	}
	if get(NameVolume, owner, "t1") != "vol-1" || get(NameSnapshot, owner, "t1") != "snap-1" {
		t.Fatal("a snapshot token overwrote the volume token")
	}
	if err := s.Update(ctx, func(tx *Tx) error {
		tx.DeleteToken(NameVolume, owner, "t1")
		tx.DeleteToken(NameVolume, owner, "")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := get(NameVolume, owner, "t1"); got != "" {
		t.Fatalf("deleted token resolves to %q", got)
	}
	if got := get(NameSnapshot, owner, "t1"); got != "snap-1" {
		t.Fatalf("deleting the volume token removed the snapshot token: %q", got)
	}
}

// TestUpdateAbort: an error from fn comes back as is and discards every
// write of the attempt.
func TestUpdateAbort(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	id := uniq("vol")
	want := errs.Conflict(errs.CodeVolumeBusy, "busy")
	err := s.Update(ctx, func(tx *Tx) error {
		tx.PutVolume(&Volume{ID: id, Status: StatusAvailable})
		return want
	})
	if err != want {
		t.Fatalf("Update returned %v (%T), want the fn's error itself", err, err)
	}
	plain := errors.New("plain")
	if err := s.Update(ctx, func(tx *Tx) error { return plain }); !errors.Is(err, plain) {
		t.Fatalf("plain error not returned: %v", err)
	}
	if _, err := s.Volume(ctx, id); !errs.IsCode(err, errs.CodeNotFound) {
		t.Fatalf("aborted write is visible: %v", err)
	}
}

// TestUpdateRetries: a transaction whose read set changed before commit is
// run again, and sees the new value.
func TestUpdateRetries(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	id := uniq("vol")
	if err := s.Update(ctx, func(tx *Tx) error {
		tx.PutVolume(&Volume{ID: id, SizeBytes: 1, Status: StatusAvailable})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	runs := 0
	err := s.Update(ctx, func(tx *Tx) error {
		runs++
		v, err := tx.Volume(id)
		if err != nil {
			return err
		}
		if runs == 1 {
			// A concurrent writer changes the record after we read it.
			if err := s.Update(ctx, func(tx2 *Tx) error {
				v2, _ := tx2.Volume(id)
				v2.SizeBytes = 2
				tx2.PutVolume(v2)
				return nil
			}); err != nil {
				return err
			}
		}
		v.SizeBytes *= 10
		tx.PutVolume(v)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if runs != 2 {
		t.Fatalf("transaction ran %d times, want 2 (one conflict, one retry)", runs)
	}
	v, err := s.Volume(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if v.SizeBytes != 20 {
		t.Fatalf("size = %d, want 20 (the retry must see the concurrent write)", v.SizeBytes)
	}
	cleanupVolume(t, s, id)
}

// TestUpdateErrorRechecked: the first attempt reads the local copy, which
// may lag; an error it returns is not trusted until a careful attempt
// (linearizable reads) returns it too.
func TestUpdateErrorRechecked(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	id := uniq("vol")
	runs := 0
	err := s.Update(ctx, func(tx *Tx) error {
		runs++
		if runs == 1 {
			return errs.NotFound("volume", id) // as if read from a lagging copy
		}
		tx.PutVolume(&Volume{ID: id, SizeBytes: 1, Status: StatusAvailable})
		return nil
	})
	if err != nil || runs != 2 {
		t.Fatalf("Update = %v after %d runs, want success on the careful second run", err, runs)
	}
	if _, err := s.Volume(ctx, id); err != nil {
		t.Fatal(err)
	}
	runs = 0
	err = s.Update(ctx, func(tx *Tx) error { runs++; return errs.NotFound("volume", "gone") })
	if !errs.IsCode(err, errs.CodeNotFound) || runs != 2 {
		t.Fatalf("Update = %v after %d runs, want NotFound after 2", err, runs)
	}
	cleanupVolume(t, s, id)
}

func TestUpdateCanceled(t *testing.T) {
	s := openTestStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := s.Update(ctx, func(tx *Tx) error { tx.Provisioned(); return nil })
	e, ok := errs.As(err)
	if !ok || e.Code != errs.CodeMetadataUnavailable || e.Kind != errs.KindUnavailable {
		t.Fatalf("Update with a canceled context: %v, want MetadataUnavailable", err)
	}
}

func TestUpdateTimesOut(t *testing.T) {
	s := openTestStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	time.Sleep(250 * time.Millisecond)
	err := s.Update(ctx, func(tx *Tx) error { tx.Provisioned(); return nil })
	if !errs.IsCode(err, errs.CodeMetadataUnavailable) {
		t.Fatalf("Update past its deadline: %v, want MetadataUnavailable", err)
	}
}

func cleanupVolume(t *testing.T, s *Store, id string) {
	t.Helper()
	if err := s.Update(context.Background(), func(tx *Tx) error { tx.DeleteVolume(id); return nil }); err != nil {
		t.Fatal(err)
	}
}

// TestUpdateEmpty: a transaction that found a prefix empty commits only if
// it still is; one that finds it taken sees the key.
func TestUpdateEmpty(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	prefix := "/basalt-test/empty/" + uniq("q") + "/"
	id := uniq("vol")
	var sawEmpty []bool
	err := s.Update(ctx, func(tx *Tx) error {
		empty := tx.Empty(prefix)
		sawEmpty = append(sawEmpty, empty)
		if len(sawEmpty) == 1 {
			// Someone queues between the look and the commit.
			if _, err := s.Client().Put(ctx, prefix+"k", "x"); err != nil {
				return err
			}
		}
		if !empty {
			return errs.Conflict(errs.CodeVolumeBusy, "taken")
		}
		tx.PutVolume(&Volume{ID: id, Status: StatusAvailable})
		return nil
	})
	if !errs.IsCode(err, errs.CodeVolumeBusy) {
		t.Fatalf("Update = %v (runs saw empty: %v), want the conflict from the run that saw the key", err, sawEmpty)
	}
	if len(sawEmpty) != 2 || !sawEmpty[0] || sawEmpty[1] {
		t.Fatalf("runs saw empty: %v, want [true false]", sawEmpty)
	}
	if _, err := s.Volume(ctx, id); !errs.IsCode(err, errs.CodeNotFound) {
		t.Fatalf("a commit went through though the prefix was taken: %v", err)
	}
	if _, err := s.Client().Delete(ctx, prefix, clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	if err := s.Update(ctx, func(tx *Tx) error {
		if !tx.Empty(prefix) {
			return errors.New("not empty")
		}
		tx.PutVolume(&Volume{ID: id, Status: StatusAvailable})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	cleanupVolume(t, s, id)
}

// TestAttemptModes: in each first-attempt mode, and through Update,
// concurrent transactions that all read and write one key lose no update,
// and an error is returned only from a careful run.
func TestAttemptModes(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	runners := map[string]func(fn func(*Tx) error) error{
		"Update": func(fn func(*Tx) error) error { return s.Update(ctx, fn) },
	}
	for name, mode := range map[string]attemptMode{"careful": modeCareful, "optimistic": modeOptimistic, "barrier": modeBarrier} {
		runners[name] = func(fn func(*Tx) error) error { return runSTM(ctx, s.txnClient(), mode, fn) }
	}
	for name, run := range runners {
		id := uniq("vol")
		if err := s.Update(ctx, func(tx *Tx) error {
			tx.PutVolume(&Volume{ID: id, Status: StatusAvailable})
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		const workers, each = 4, 10
		var wg sync.WaitGroup
		errc := make(chan error, workers)
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range each {
					if err := run(func(tx *Tx) error {
						v, err := tx.Volume(id)
						if err != nil || v == nil {
							return fmt.Errorf("volume %s: %v", id, err)
						}
						v.SizeBytes++
						tx.PutVolume(v)
						return nil
					}); err != nil {
						errc <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errc)
		for err := range errc {
			t.Fatalf("%s: %v", name, err)
		}
		if v, err := s.Volume(ctx, id); err != nil || v.SizeBytes != workers*each {
			t.Fatalf("%s: counter %v (%v), want %d: an update was lost", name, v, err, workers*each)
		}
		runs := 0
		err := run(func(tx *Tx) error { runs++; tx.Volume(id); return errs.NotFound("x", "y") })
		want := 2
		if name == "careful" {
			want = 1
		}
		if !errs.IsCode(err, errs.CodeNotFound) || runs != want {
			t.Fatalf("%s: error %v after %d runs, want NotFound after %d", name, err, runs, want)
		}
		cleanupVolume(t, s, id)
	}
}
