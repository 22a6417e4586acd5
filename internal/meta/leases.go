package meta

// Volume write leases: which node may write a volume (package volume,
// lease.go, owns the protocol). A lease is the key
//
//	leases/volumes/<volume id>   VolumeLease, attached to the holder node's etcd lease
//
// created only when absent, so at most one node holds a volume. The key's
// create revision is the holder's fencing token: it grows with every new
// holder.
//
// The key goes only by the holder's doing or with the holder's etcd lease
// (death, partition: it stopped renewing): only the holder knows when it
// has stopped writing. Another node that gives the lease up (the volume's
// last rw attachment was detached through it) marks the key Released
// instead of deleting it; the holder, seeing the mark, stops its writers
// and deletes the key; a holder that cannot see it — cut off, still
// writing until its lease validity runs out — loses the key when its etcd
// lease expires, after that validity. Only then can another node create
// the key.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const prefixVolumeLeases = Prefix + "leases/volumes/"

// VolumeLease is the value of a volume's lease key.
type VolumeLease struct {
	Schema   int       `json:"schema"`
	Node     string    `json:"node"`
	Acquired time.Time `json:"acquired"`
	// Released: a node other than the holder gave the lease up; the
	// holder deletes the key once it has stopped writing.
	Released bool `json:"released,omitempty"`
	// Token is the key's create revision (filled in on read).
	Token int64 `json:"-"`
}

func (l *VolumeLease) schema() int { return l.Schema }

// leaseClient is the client that grants and renews this node's etcd
// leases: its own voting member while that serves (txnClient), which
// forwards them to the leader — so that a renewal never waits on another
// member cut off from the cluster, which the cluster client may have
// picked and would only give up after its keepalive timeout, longer than
// the leases' TTL — else the cluster client.
func (s *Store) leaseClient() *clientv3.Client { return s.txnClient() }

// ErrLeaseGone: the etcd lease expired (or was revoked); every key on it
// is gone.
var ErrLeaseGone = errors.New("lease expired")

// GrantLease creates an etcd lease of ttl.
func (s *Store) GrantLease(ctx context.Context, ttl time.Duration) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.writeTimeout())
	defer cancel()
	r, err := s.leaseClient().Grant(ctx, int64(ttl/time.Second))
	if err != nil {
		return 0, wrap("grant lease", err)
	}
	return int64(r.ID), nil
}

// RenewLease renews lease id once; ErrLeaseGone if it expired.
func (s *Store) RenewLease(ctx context.Context, id int64) error {
	_, err := s.leaseClient().KeepAliveOnce(ctx, clientv3.LeaseID(id))
	if errors.Is(err, rpctypes.ErrLeaseNotFound) || err != nil && strings.Contains(err.Error(), "requested lease not found") {
		return ErrLeaseGone
	}
	return wrap("renew lease", err)
}

// RevokeLease ends lease id and deletes its keys.
func (s *Store) RevokeLease(ctx context.Context, id int64) error {
	ctx, cancel := context.WithTimeout(ctx, s.writeTimeout())
	defer cancel()
	_, err := s.cli.Revoke(ctx, clientv3.LeaseID(id))
	return wrap("revoke lease", err)
}

// AcquireVolumeLease makes node the holder of volume vol's lease, attached
// to etcd lease id, unless another node holds it — released or not: a
// released key is still its holder's until the holder deletes it or its
// etcd lease ends. It returns the holder either way (with its token). A
// key node holds on id that another node marked released is node's again,
// the mark cleared: node serves a rw attachment of the volume once more.
func (s *Store) AcquireVolumeLease(ctx context.Context, vol, node string, id int64) (*VolumeLease, error) {
	ctx, cancel := context.WithTimeout(ctx, s.writeTimeout())
	defer cancel()
	key := prefixVolumeLeases + vol
	for attempt := 0; ; attempt++ {
		rec := &VolumeLease{Schema: SchemaVersion, Node: node, Acquired: time.Now().UTC()}
		r, err := s.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, encode(rec), clientv3.WithLease(clientv3.LeaseID(id))), clientv3.OpGet(key)).
			Else(clientv3.OpGet(key)).
			Commit()
		if err != nil {
			return nil, wrap("acquire volume lease "+vol, err)
		}
		get := r.Responses[len(r.Responses)-1].GetResponseRange()
		if len(get.Kvs) == 0 {
			return nil, fmt.Errorf("acquire volume lease %s: the key vanished", vol)
		}
		kv := get.Kvs[0]
		got := &VolumeLease{}
		if err := decode(key, kv.Value, got); err != nil {
			return nil, err
		}
		got.Token = kv.CreateRevision
		if got.Node != node {
			return got, nil
		}
		if kv.Lease != id {
			// Ours, but on another etcd lease: one of this node's previous
			// lives (a restart within the TTL) still holds it.
			return nil, &PreviousLeaseError{Lease: kv.Lease}
		}
		if !got.Released {
			return got, nil
		}
		got.Released = false
		r, err = s.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)).
			Then(clientv3.OpPut(key, encode(got), clientv3.WithIgnoreLease())).
			Commit()
		if err != nil {
			return nil, wrap("acquire volume lease "+vol, err)
		}
		if r.Succeeded {
			return got, nil
		}
		if attempt == 2 {
			return nil, fmt.Errorf("acquire volume lease %s: the key keeps changing; retry", vol)
		}
	}
}

// PreviousLeaseError: the volume's lease is held by this node's name on an
// etcd lease of a previous run of the node.
type PreviousLeaseError struct{ Lease int64 }

func (e *PreviousLeaseError) Error() string {
	return fmt.Sprintf("the volume's lease is held on etcd lease %x of a previous run of this node", e.Lease)
}

// VolumeLeaseHolder returns the holder of vol's lease, nil if none.
func (s *Store) VolumeLeaseHolder(ctx context.Context, vol string) (*VolumeLease, error) {
	resp, err := s.read(ctx, prefixVolumeLeases+vol)
	if err != nil {
		return nil, wrap("volume lease "+vol, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	return decodeVolumeLease(resp.Kvs[0])
}

// VolumeLeaseHolders returns the lease holders of volumes vols, by
// volume id — every one of them, nil for a volume whose lease nobody
// holds — read at one revision, in batched Gets (getMany).
func (s *Store) VolumeLeaseHolders(ctx context.Context, vols []string) (map[string]*VolumeLease, error) {
	keys := make([]string, len(vols))
	for i, vol := range vols {
		keys[i] = prefixVolumeLeases + vol
	}
	kvs, err := s.getMany(ctx, keys)
	if err != nil {
		return nil, wrap("volume leases", err)
	}
	out := make(map[string]*VolumeLease, len(vols))
	for i, kv := range kvs {
		out[vols[i]] = nil
		if kv == nil {
			continue
		}
		l, err := decodeVolumeLease(kv)
		if err != nil {
			return nil, err
		}
		out[vols[i]] = l
	}
	return out, nil
}

func decodeVolumeLease(kv *mvccpb.KeyValue) (*VolumeLease, error) {
	l := &VolumeLease{}
	if err := decode(string(kv.Key), kv.Value, l); err != nil {
		return nil, err
	}
	l.Token = kv.CreateRevision
	return l, nil
}

// ReleaseVolumeLease gives vol's lease up for node, whose etcd lease is
// id: the volume has no rw attachment left. A key node holds (on id, or on
// an etcd lease of a previous run of node, which is dead) is deleted, so
// another node may take the lease at once. A key another node holds is
// only marked Released: that node may be cut off and writing still, and
// the key must stay until it deletes the key itself or its etcd lease
// ends.
func (s *Store) ReleaseVolumeLease(ctx context.Context, vol, node string, id int64) error {
	ctx, cancel := context.WithTimeout(ctx, s.writeTimeout())
	defer cancel()
	key := prefixVolumeLeases + vol
	resp, err := s.cli.Get(ctx, key)
	if err != nil || len(resp.Kvs) == 0 {
		return wrap("release volume lease "+vol, err)
	}
	kv := resp.Kvs[0]
	l, err := decodeVolumeLease(kv)
	if err != nil {
		return err
	}
	same := clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)
	switch {
	case l.Node == node:
		_, err = s.cli.Txn(ctx).If(same).Then(clientv3.OpDelete(key)).Commit()
	case !l.Released:
		l.Released = true
		_, err = s.cli.Txn(ctx).If(same).Then(clientv3.OpPut(key, encode(l), clientv3.WithIgnoreLease())).Commit()
	}
	return wrap("release volume lease "+vol, err)
}

// VolumeLeaseEvent is a change of a volume's lease key.
type VolumeLeaseEvent struct {
	Volume string
	// Rev is the revision of the change.
	Rev int64
	// Lease is the key's value after the change; nil: the key was
	// deleted (released by its holder, expired, revoked).
	Lease *VolumeLease
}

// WatchVolumeLeases calls fn with every change of a volume lease key until
// ctx ends. Whenever the watch (re)starts, fn first gets every key as it
// stands, so that no mark is missed while the watch was down, and a
// deletion of every key seen before that is gone now (at the listing's
// revision): a holder that died while the watch was down is taken over
// all the same. An event may arrive after newer changes were made: a
// holder compares a deletion's revision with its key's create revision
// (its Token), and rereads a key before it acts on a mark.
func (s *Store) WatchVolumeLeases(ctx context.Context, fn func(VolumeLeaseEvent)) {
	known := map[string]bool{} // volumes whose key the last event about it showed
	for ctx.Err() == nil {
		s.watchVolumeLeases(ctx, known, fn)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (s *Store) watchVolumeLeases(ctx context.Context, known map[string]bool, fn func(VolumeLeaseEvent)) {
	cur, err := s.cli.Get(ctx, prefixVolumeLeases, clientv3.WithPrefix())
	if err != nil {
		return
	}
	event := func(kv *mvccpb.KeyValue, deleted bool) {
		vol := strings.TrimPrefix(string(kv.Key), prefixVolumeLeases)
		if deleted {
			delete(known, vol)
		} else {
			known[vol] = true
		}
		s.volumeLeaseEvent(kv, deleted, fn)
	}
	gone := maps.Clone(known)
	for _, kv := range cur.Kvs {
		delete(gone, strings.TrimPrefix(string(kv.Key), prefixVolumeLeases))
		event(kv, false)
	}
	for vol := range gone {
		event(&mvccpb.KeyValue{Key: []byte(prefixVolumeLeases + vol), ModRevision: cur.Header.Revision}, true)
	}
	wch := s.cli.Watch(clientv3.WithRequireLeader(ctx), prefixVolumeLeases, clientv3.WithPrefix(),
		clientv3.WithRev(cur.Header.Revision+1))
	for resp := range wch {
		for _, ev := range resp.Events {
			event(ev.Kv, ev.Type == clientv3.EventTypeDelete)
		}
	}
}

func (s *Store) volumeLeaseEvent(kv *mvccpb.KeyValue, deleted bool, fn func(VolumeLeaseEvent)) {
	ev := VolumeLeaseEvent{Volume: strings.TrimPrefix(string(kv.Key), prefixVolumeLeases), Rev: kv.ModRevision}
	if !deleted {
		l, err := decodeVolumeLease(kv)
		if err != nil {
			s.log.Warn("volume lease key unreadable", "key", string(kv.Key), "err", err)
			return
		}
		ev.Lease = l
	}
	fn(ev)
}
