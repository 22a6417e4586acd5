package meta

import "strings"

// Prefix is the root of every basalt key in etcd.
const Prefix = "/basalt/"

const (
	keyCluster     = Prefix + "cluster"
	keyCA          = Prefix + "pki/ca"
	keyDataKey     = Prefix + "pki/data-key"
	keyStoreID     = Prefix + "store-id"
	keyProvisioned = Prefix + "capacity/provisioned"
	prefixUsers    = Prefix + "users/"
	prefixS3Keys   = Prefix + "s3keys/"
	prefixVolumes  = Prefix + "volumes/"
	prefixSnaps    = Prefix + "snapshots/"
	prefixNames    = Prefix + "names/"
	prefixTokens   = Prefix + "tokens/"
	prefixAttach   = Prefix + "attachments/"
	prefixExports  = Prefix + "exports/"
	prefixTypes    = Prefix + "types/"
	prefixBuckets  = Prefix + "buckets/"
	prefixOwned    = Prefix + "owned/"
	prefixOrdered  = Prefix + "ordered/"
)

func userKey(name string) string     { return prefixUsers + name }
func s3Key(access string) string     { return prefixS3Keys + access }
func volumeKey(id string) string     { return prefixVolumes + id }
func snapshotKey(id string) string   { return prefixSnaps + id }
func attachmentKey(id string) string { return prefixAttach + id }
func exportKey(name string) string   { return prefixExports + name }
func typeKey(name string) string     { return prefixTypes + name }
func bucketKey(name string) string   { return prefixBuckets + name }

// Name kinds for ClaimName.
const (
	NameVolume   = "volume"
	NameSnapshot = "snapshot"
)

func tokenKey(kind, owner, token string) string {
	return prefixTokens + kind + "/" + owner + "/" + token
}

func nameKey(kind, owner, name string) string {
	return prefixNames + kind + "/" + owner + "/" + name
}

// validKeyPart reports whether s can be embedded in a key without changing
// the key's structure.
func validKeyPart(s string) bool {
	return s != "" && !strings.ContainsAny(s, "/\x00")
}
