// Package meta is basalt's metadata store: the package that talks to etcd.
// It owns every key, every record type and every transaction; other
// packages ask it for typed records and typed updates. The one exception
// is package lock, whose algorithm needs raw leases, watches and revision
// ordering: it gets the client (Client) and owns the keys under locks/.
//
// A node either runs an embedded etcd member (the default; see embed.go) or
// connects to an existing etcd cluster (--meta-endpoints). The same Store code
// serves both.
//
// Key layout (all under Prefix, "/basalt/"):
//
//	cluster                      Cluster record (id, created_at)
//	pki/ca                       the cluster CA, certificate and key (PEM)
//	users/<name>                 User
//	s3keys/<access key id>       user name (index; S3 authentication)
//	volumes/<id>                 Volume
//	snapshots/<id>               Snapshot
//	names/<kind>/<owner id>/<name>  id; makes names unique per owner and kind
//	tokens/<kind>/<user id>/<token>  id; idempotency tokens of create calls, the caller's
//	attachments/<id>             Attachment
//	exports/<export name>        attachment id (index; NBD export lookup)
//	owned/<kind>/<owner id>/<created_at>/<id>  id (index; a user's lists, owned.go)
//	ordered/<kind>/<created_at>/<id>  id (index; an admin's lists of everything,
//	                             owned.go)
//	capacity/provisioned         bytes promised to volumes and snapshots
//	nodes/<name>                 Node (members.go); alive/<name> while its lease lives
//	jointokens/<sha256>          a join token, on a lease (its expiry)
//	joinlock/...                 the mutex serializing joins
//	leases/volumes/<volume id>   VolumeLease: the node that writes the volume (leases.go)
//	locks/<resource>/...         workflow locks (package lock)
//
// Invariants, each kept by doing the related writes in one transaction (Tx):
//   - a names/ key exists exactly when a live record carries that name;
//   - capacity/provisioned equals the sum of size_bytes of every volume and
//     snapshot record that has not finished deleting;
//   - a volume's attachments list holds exactly the ids of the attachment
//     records naming it, and an exports/ key exists exactly for each
//     attachment's export;
//   - an owned/ key (by kind, owner_id, created_at, id) and an ordered/
//     key (by kind, created_at, id) exist exactly for each volume,
//     snapshot and attachment record (Tx's Put and Delete methods keep them;
//     CheckOwnedIndex checks them);
//   - every record carries Schema; readers refuse a Schema newer than they
//     know (a newer binary wrote it) and migrate older ones on read.
//
// A Tx commits only if everything it read is still as read (stm.go), so
// its reads may come from the node's own copy; an error a Tx returns was
// found on a linearizable rerun.
package meta
