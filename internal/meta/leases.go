package meta

// Volume write leases: which node may write a volume (package volume,
// lease.go, owns the protocol). A lease is the key
//
//	leases/volumes/<volume id>   VolumeLease, attached to the holder node's etcd lease
//
// created only when absent, so at most one node holds a volume; it vanishes
// when the holder stops renewing its etcd lease (death, partition), and
// only then can another node create it. The key's create revision is the
// holder's fencing token: it grows with every new holder.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const prefixVolumeLeases = Prefix + "leases/volumes/"

// VolumeLease is the value of a volume's lease key.
type VolumeLease struct {
	Schema   int       `json:"schema"`
	Node     string    `json:"node"`
	Acquired time.Time `json:"acquired"`
	// Token is the key's create revision (filled in on read).
	Token int64 `json:"-"`
}

func (l *VolumeLease) schema() int { return l.Schema }

// ErrLeaseGone: the etcd lease expired (or was revoked); every key on it
// is gone.
var ErrLeaseGone = errors.New("lease expired")

// GrantLease creates an etcd lease of ttl.
func (s *Store) GrantLease(ctx context.Context, ttl time.Duration) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.writeTimeout())
	defer cancel()
	r, err := s.cli.Grant(ctx, int64(ttl/time.Second))
	if err != nil {
		return 0, wrap("grant lease", err)
	}
	return int64(r.ID), nil
}

// RenewLease renews lease id once; ErrLeaseGone if it expired.
func (s *Store) RenewLease(ctx context.Context, id int64) error {
	_, err := s.cli.KeepAliveOnce(ctx, clientv3.LeaseID(id))
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
// to etcd lease id, unless another node holds it. It returns the holder
// either way (with its token).
func (s *Store) AcquireVolumeLease(ctx context.Context, vol, node string, id int64) (*VolumeLease, error) {
	ctx, cancel := context.WithTimeout(ctx, s.writeTimeout())
	defer cancel()
	key := prefixVolumeLeases + vol
	rec := &VolumeLease{Schema: SchemaVersion, Node: node, Acquired: time.Now().UTC()}
	r, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, encode(rec), clientv3.WithLease(clientv3.LeaseID(id))), clientv3.OpGet(key)).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return nil, wrap("acquire volume lease", err)
	}
	get := r.Responses[len(r.Responses)-1].GetResponseRange()
	if len(get.Kvs) == 0 {
		return nil, errors.New("acquire volume lease: the key vanished")
	}
	kv := get.Kvs[0]
	got := &VolumeLease{}
	if err := decode(key, kv.Value, got); err != nil {
		return nil, err
	}
	got.Token = kv.CreateRevision
	if got.Node == node && kv.Lease != id {
		// Ours, but on another etcd lease: one of this node's previous
		// lives (a restart within the TTL) still holds it.
		return nil, &PreviousLeaseError{Lease: kv.Lease}
	}
	return got, nil
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
		return nil, wrap("volume lease", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	l := &VolumeLease{}
	if err := decode(prefixVolumeLeases+vol, resp.Kvs[0].Value, l); err != nil {
		return nil, err
	}
	l.Token = resp.Kvs[0].CreateRevision
	return l, nil
}

// ReleaseVolumeLease deletes vol's lease if node holds it ("": whoever does).
func (s *Store) ReleaseVolumeLease(ctx context.Context, vol, node string) error {
	ctx, cancel := context.WithTimeout(ctx, s.writeTimeout())
	defer cancel()
	key := prefixVolumeLeases + vol
	resp, err := s.cli.Get(ctx, key)
	if err != nil || len(resp.Kvs) == 0 {
		return wrap("release volume lease", err)
	}
	l := &VolumeLease{}
	if err := decode(key, resp.Kvs[0].Value, l); err != nil || node != "" && l.Node != node {
		return err
	}
	_, err = s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", resp.Kvs[0].ModRevision)).
		Then(clientv3.OpDelete(key)).Commit()
	return wrap("release volume lease", err)
}

// WatchVolumeLeases calls fn with a volume id and the revision of the
// deletion whenever its lease key is deleted (expired, released, revoked),
// until ctx ends. The event may arrive after a new key was put: a holder
// compares the revision with its key's create revision (its Token).
func (s *Store) WatchVolumeLeases(ctx context.Context, fn func(vol string, rev int64)) {
	for ctx.Err() == nil {
		wch := s.cli.Watch(clientv3.WithRequireLeader(ctx), prefixVolumeLeases, clientv3.WithPrefix(), clientv3.WithFilterPut())
		for resp := range wch {
			for _, ev := range resp.Events {
				fn(strings.TrimPrefix(string(ev.Kv.Key), prefixVolumeLeases), ev.Kv.ModRevision)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}
