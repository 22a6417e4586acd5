package meta

import clientv3 "go.etcd.io/etcd/client/v3"

// LocksPrefix is the root of the lock service's keys (package lock):
//
//	locks/<escaped resource>/<holder id>   one key per holder or waiter,
//	                                       attached to its session's lease
//
// The lock package owns everything under it; no other record refers to it.
const LocksPrefix = Prefix + "locks/"

// Client is the raw etcd client. It exists for package lock alone, whose
// algorithm needs leases, watches and create-revision ordering that the typed
// records of this package do not offer; every other package goes through the
// Store's typed methods.
func (s *Store) Client() *clientv3.Client { return s.cli }
