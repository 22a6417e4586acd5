package meta

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/pki"
)

func TestHealthAndStatus(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	if err := s.Health(ctx); err != nil {
		t.Fatalf("Health: %v", err)
	}
	if !s.Embedded() {
		t.Fatal("store with no endpoints does not report an embedded member")
	}
	st, err := s.Status(ctx)
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	if !st.Embedded || st.Members != 1 || st.Version == "" || st.Leader == 0 || st.DBSize <= 0 {
		t.Fatalf("Status = %+v", st)
	}
	if len(st.Endpoints) != 1 || st.Endpoints[0] != testEnv.clientURL {
		t.Fatalf("endpoints %v, want [%s]", st.Endpoints, testEnv.clientURL)
	}
	if len(st.Alarms) != 0 {
		t.Fatalf("alarms on a fresh member: %v", st.Alarms)
	}
}

func TestDefrag(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	// Make some history to compact.
	id := uniq("vol")
	for i := range 20 {
		if err := s.Update(ctx, func(tx *Tx) error {
			tx.PutVolume(&Volume{ID: id, SizeBytes: int64(i), Status: StatusAvailable})
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Defrag(ctx); err != nil {
		t.Fatalf("Defrag: %v", err)
	}
	// Data survives; the member is healthy; a second defrag (nothing to
	// compact: ErrCompacted) is fine too.
	v, err := s.Volume(ctx, id)
	if err != nil || v.SizeBytes != 19 {
		t.Fatalf("after defrag: %+v, %v", v, err)
	}
	if err := s.Health(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Defrag(ctx); err != nil {
		t.Fatalf("second Defrag: %v", err)
	}
	cleanupVolume(t, s, id)
}

func TestRecords(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	uid := 1000
	u := &User{Name: uniq("user"), ID: "id1", Admin: true, UID: &uid, AccessKeyID: uniq("AK"), SecretKey: "secret", CreatedAt: time.Now().UTC().Truncate(time.Millisecond)}
	v := &Volume{ID: uniq("vol"), Name: "n", Owner: u.Name, OwnerID: u.ID, SizeBytes: 4096, Status: StatusAvailable, Type: "standard",
		Job: &Job{Kind: JobFlatten, Done: 1, Total: 4096}, Snapshotting: []string{"snap-a"}}
	sn := &Snapshot{ID: uniq("snap"), Owner: u.Name, OwnerID: u.ID, VolumeID: v.ID, SizeBytes: 4096, Status: StatusCreating, Image: "img-1"}
	if err := s.Update(ctx, func(tx *Tx) error {
		tx.PutUser(u)
		tx.PutVolume(v)
		tx.PutSnapshot(sn)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if u.Schema != SchemaVersion || v.Schema != SchemaVersion || sn.Schema != SchemaVersion {
		t.Fatal("Put does not stamp the schema version")
	}

	gu, err := s.User(ctx, u.Name)
	if err != nil {
		t.Fatal(err)
	}
	if gu.ID != u.ID || !gu.Admin || gu.UID == nil || *gu.UID != 1000 || gu.GID != nil || gu.SecretKey != "secret" || !gu.CreatedAt.Equal(u.CreatedAt) {
		t.Fatalf("user round trip: %+v", gu)
	}
	if bu, err := s.UserByAccessKey(ctx, u.AccessKeyID); err != nil || bu.Name != u.Name {
		t.Fatalf("UserByAccessKey: %+v, %v", bu, err)
	}
	gv, err := s.Volume(ctx, v.ID)
	if err != nil {
		t.Fatal(err)
	}
	if gv.Job == nil || gv.Job.Done != 1 || len(gv.Snapshotting) != 1 || gv.Owner != u.Name {
		t.Fatalf("volume round trip: %+v", gv)
	}
	gs, err := s.Snapshot(ctx, sn.ID)
	if err != nil {
		t.Fatal(err)
	}
	if gs.VolumeID != v.ID || gs.Image != "img-1" || gs.Status != StatusCreating {
		t.Fatalf("snapshot round trip: %+v", gs)
	}
	contains := func(ids []string, id string) bool {
		for _, x := range ids {
			if x == id {
				return true
			}
		}
		return false
	}
	users, err := s.Users(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, x := range users {
		names = append(names, x.Name)
	}
	vols, err := s.Volumes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var vids []string
	for _, x := range vols {
		vids = append(vids, x.ID)
	}
	snaps, err := s.Snapshots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var sids []string
	for _, x := range snaps {
		sids = append(sids, x.ID)
	}
	if !contains(names, u.Name) || !contains(vids, v.ID) || !contains(sids, sn.ID) {
		t.Fatalf("lists miss records: users %v volumes %v snapshots %v", names, vids, sids)
	}

	// Deleting the user removes the access key index too.
	if err := s.Update(ctx, func(tx *Tx) error {
		tx.DeleteUser(u)
		tx.DeleteVolume(v.ID)
		tx.DeleteSnapshot(sn.ID)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for what, err := range map[string]error{
		"user":       errOf(s.User(ctx, u.Name)),
		"access key": errOf(s.UserByAccessKey(ctx, u.AccessKeyID)),
		"volume":     errOf(s.Volume(ctx, v.ID)),
		"snapshot":   errOf(s.Snapshot(ctx, sn.ID)),
	} {
		e, ok := errs.As(err)
		if !ok || e.Code != errs.CodeNotFound || e.Kind != errs.KindNotFound {
			t.Errorf("deleted %s: %v, want NotFound", what, err)
		}
	}
	// Absent records inside a transaction are nil, not errors.
	if err := s.Update(ctx, func(tx *Tx) error {
		u2, err1 := tx.User(u.Name)
		v2, err2 := tx.Volume(v.ID)
		s2, err3 := tx.Snapshot(sn.ID)
		if u2 != nil || v2 != nil || s2 != nil || err1 != nil || err2 != nil || err3 != nil {
			t.Errorf("absent records in Tx: %v %v %v %v %v %v", u2, v2, s2, err1, err2, err3)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func errOf[T any](_ T, err error) error { return err }

// TestSchemaCheck: a record written by a newer binary (schema 99) is refused
// by every reader with an error that says what to do; a corrupt record is
// reported as corrupt; schema 1 written raw reads fine.
func TestSchemaCheck(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	cli := rawClient(t)
	volID, userName, snapID := uniq("vol"), uniq("user"), uniq("snap")
	put := func(key, val string) {
		t.Helper()
		if _, err := cli.Put(ctx, key, val); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, k := range []string{volumeKey(volID), userKey(userName), snapshotKey(snapID)} {
			cli.Delete(context.Background(), k)
		}
	})

	put(volumeKey(volID), `{"schema":99,"id":"`+volID+`","size_bytes":1,"status":"available","hologram":true}`)
	put(userKey(userName), `{"schema":99,"name":"`+userName+`"}`)
	put(snapshotKey(snapID), `{"schema":99,"id":"`+snapID+`"}`)

	checkNewer := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s: record with schema 99 was accepted", what)
		}
		msg := err.Error()
		if !strings.Contains(msg, "schema 99") || !strings.Contains(msg, "upgrade") {
			t.Fatalf("%s: error %q does not say the schema is newer and to upgrade", what, msg)
		}
		if errs.IsCode(err, errs.CodeNotFound) {
			t.Fatalf("%s: newer record reported as NotFound", what)
		}
	}
	checkNewer("Volume", errOf(s.Volume(ctx, volID)))
	checkNewer("Volumes", errOf(s.Volumes(ctx)))
	checkNewer("User", errOf(s.User(ctx, userName)))
	checkNewer("Snapshot", errOf(s.Snapshot(ctx, snapID)))
	checkNewer("Tx.Volume", s.Update(ctx, func(tx *Tx) error { _, err := tx.Volume(volID); return err }))
	checkNewer("Tx.User", s.Update(ctx, func(tx *Tx) error { _, err := tx.User(userName); return err }))
	checkNewer("Tx.Snapshot", s.Update(ctx, func(tx *Tx) error { _, err := tx.Snapshot(snapID); return err }))

	// Corrupt JSON.
	put(volumeKey(volID), `{"schema":1,"id":`)
	if err := errOf(s.Volume(ctx, volID)); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("corrupt record: %v", err)
	}
	// Current schema written raw, with an unknown extra field: accepted.
	put(volumeKey(volID), `{"schema":1,"id":"`+volID+`","size_bytes":512,"status":"available","from_the_future":1}`)
	v, err := s.Volume(ctx, volID)
	if err != nil || v.SizeBytes != 512 {
		t.Fatalf("schema 1 record: %+v, %v", v, err)
	}
}

// TestBootstrap: the first Bootstrap records the cluster and its CA; later
// calls, with any other CA, get the first one back. Racing first calls
// agree on one CA.
func TestBootstrap(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	cli := rawClient(t)
	// Start from an unbootstrapped store (another test run in this process
	// may have bootstrapped it).
	if _, err := cli.Delete(ctx, keyCluster); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctx, keyCA); err != nil {
		t.Fatal(err)
	}

	ca1, err := pki.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	ca2, err := pki.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	c1, cert1, key1, err := s.Bootstrap(ctx, "cluster-one", 3, ca1.CertPEM, ca1.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if c1.ID != "cluster-one" || c1.Schema != SchemaVersion || c1.CreatedAt.IsZero() {
		t.Fatalf("cluster record %+v", c1)
	}
	if !bytes.Equal(cert1, ca1.CertPEM) || !bytes.Equal(key1, ca1.KeyPEM) {
		t.Fatal("first bootstrap did not return its own CA")
	}
	c2, cert2, key2, err := s.Bootstrap(ctx, "cluster-two", 3, ca2.CertPEM, ca2.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if c2.ID != "cluster-one" || !c2.CreatedAt.Equal(c1.CreatedAt) {
		t.Fatalf("second bootstrap changed the cluster: %+v", c2)
	}
	if !bytes.Equal(cert2, ca1.CertPEM) || !bytes.Equal(key2, ca1.KeyPEM) {
		t.Fatal("second bootstrap did not return the first CA")
	}
	if _, err := pki.ParseCA(cert2, key2); err != nil {
		t.Fatalf("stored CA does not parse: %v", err)
	}

	// Race.
	cli.Delete(ctx, keyCluster)
	cli.Delete(ctx, keyCA)
	const n = 6
	cas := make([]*pki.CA, n)
	for i := range cas {
		if cas[i], err = pki.NewCA(); err != nil {
			t.Fatal(err)
		}
	}
	type result struct {
		id        string
		cert, key []byte
		err       error
	}
	res := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, cert, key, err := s.Bootstrap(ctx, "race-"+string(rune('a'+i)), 3, cas[i].CertPEM, cas[i].KeyPEM)
			res[i] = result{err: err, cert: cert, key: key}
			if c != nil {
				res[i].id = c.ID
			}
		}()
	}
	wg.Wait()
	winner := -1
	for i, ca := range cas {
		if bytes.Equal(ca.CertPEM, res[0].cert) {
			winner = i
		}
	}
	if winner < 0 {
		t.Fatal("racing bootstraps returned a CA nobody offered")
	}
	for i, r := range res {
		if r.err != nil {
			t.Fatalf("bootstrap %d: %v", i, r.err)
		}
		if !bytes.Equal(r.cert, cas[winner].CertPEM) || !bytes.Equal(r.key, cas[winner].KeyPEM) || r.id != "race-"+string(rune('a'+winner)) {
			t.Fatalf("bootstrap %d got a different cluster or CA than bootstrap 0", i)
		}
	}
}

// TestExternalEndpoints: a Store opened on endpoints (no embedded member)
// sees the same data, and closing it leaves the member running.
func TestExternalEndpoints(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	ext, err := Open(ctx, Config{Endpoints: []string{testEnv.clientURL}, ExternalTLS: testEnv.clientTLS},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("open external: %v", err)
	}
	if ext.Embedded() {
		t.Fatal("external store claims an embedded member")
	}
	id := uniq("vol")
	if err := ext.Update(ctx, func(tx *Tx) error {
		tx.PutVolume(&Volume{ID: id, SizeBytes: 4096, Status: StatusAvailable})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Volume(ctx, id); err != nil || v.SizeBytes != 4096 {
		t.Fatalf("write through the external store not visible: %+v, %v", v, err)
	}
	st, err := ext.Status(ctx)
	if err != nil || st.Embedded || st.Members != 1 || st.Version == "" || st.Leader == 0 || st.DBSize <= 0 {
		t.Fatalf("external status %+v, %v", st, err)
	}
	ext.Close()
	if err := s.Health(ctx); err != nil {
		t.Fatalf("closing an external store hurt the member: %v", err)
	}
	cleanupVolume(t, s, id)
}

// TestOpenUnreachable: an endpoint nobody serves fails Open within the
// caller's deadline instead of hanging.
func TestOpenUnreachable(t *testing.T) {
	openTestStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	_, err := Open(ctx, Config{Endpoints: []string{"https://" + freeAddr(t)}, ExternalTLS: testEnv.clientTLS},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil {
		t.Fatal("Open of an unserved endpoint succeeded")
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("Open took %v to fail", d)
	}
}

// TestMemberRequiresClientCert: the embedded member's client port refuses a
// TLS client without a certificate from the cluster CA (brief §9: a local
// user cannot read the metadata).
func TestMemberRequiresClientCert(t *testing.T) {
	openTestStore(t)
	addr := strings.TrimPrefix(testEnv.clientURL, "https://")
	for name, cfg := range map[string]*tls.Config{
		"no client certificate": cloneNoCert(),
		"foreign certificate":   foreignTLS(t),
		"own certificate":       testEnv.clientTLS.Clone(),
	} {
		cfg.NextProtos = []string{"h2"}
		conn, err := tls.Dial("tcp", addr, cfg)
		if err == nil {
			// TLS 1.3: the server judges the client certificate after the
			// client's half of the handshake; its verdict arrives on read.
			conn.SetDeadline(time.Now().Add(time.Second))
			_, err = conn.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
			if err == nil {
				_, err = conn.Read(make([]byte, 1))
			}
			conn.Close()
		}
		t.Logf("%s: %v", name, err)
		if name == "own certificate" {
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s: the member accepted the connection", name)
		} else if ne, ok := err.(interface{ Timeout() bool }); ok && ne.Timeout() {
			t.Errorf("%s: no verdict within a second (%v)", name, err)
		}
	}
}

func cloneNoCert() *tls.Config {
	c := testEnv.clientTLS.Clone()
	c.Certificates = nil
	return c
}

func foreignTLS(t *testing.T) *tls.Config {
	ca, err := pki.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	is, err := ca.IssueClient("intruder", "x", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	id := &pki.Identity{CAPEM: testEnv.ca.CertPEM, CertPEM: is.CertPEM, KeyPEM: is.KeyPEM}
	c, err := id.ClientTLS()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestRecordJSONShape pins the stored field names that other versions and
// operators rely on (docs/formats.md).
func TestRecordJSONShape(t *testing.T) {
	v := &Volume{Schema: 1, ID: "vol-1", SizeBytes: 1, Status: StatusExtending, TargetSize: 2, Job: &Job{Kind: JobFlatten, Done: 1, Total: 2}}
	var m map[string]any
	if err := json.Unmarshal([]byte(encode(v)), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"schema", "id", "owner", "owner_id", "size_bytes", "status", "type", "multiattach", "created_at", "target_size", "job"} {
		if _, ok := m[k]; !ok {
			t.Errorf("volume record lacks %q: %v", k, m)
		}
	}
	job := m["job"].(map[string]any)
	for _, k := range []string{"kind", "node", "done", "total", "started_at"} {
		if _, ok := job[k]; !ok {
			t.Errorf("job lacks %q: %v", k, job)
		}
	}
}

// TestStoreID: the first id proposed is recorded; later proposals return
// it, and reading without one does not record anything.
func TestStoreID(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	first, err := s.StoreID(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if first == "" { // this test's etcd has none yet (it is shared)
		if again, err := s.StoreID(ctx, ""); err != nil || again != "" {
			t.Fatalf("a read recorded an id: %q, %v", again, err)
		}
		if first, err = s.StoreID(ctx, "store-a"); err != nil || first != "store-a" {
			t.Fatalf("first proposal: %q, %v", first, err)
		}
	}
	if got, err := s.StoreID(ctx, "store-b"); err != nil || got != first {
		t.Fatalf("a later proposal: %q, %v, want the recorded %q", got, err, first)
	}
	if got, err := s.StoreID(ctx, ""); err != nil || got != first {
		t.Fatalf("read: %q, %v, want %q", got, err, first)
	}
}
