// Package volume is the volume and snapshot service: it validates requests,
// enforces ownership and thin-provisioning limits, and drives every workflow
// (create, clone, extend, snapshot, delete) as a state machine persisted in
// the metadata store.
//
// Workflow shape: a transaction moves the record into a transitional status
// (creating, extending, deleting) and records which node drives it; the node
// does the data work (idempotent: create-if-absent, resize-to, copy-to-temp
// then rename, remove-if-present); a second transaction moves the record to
// its resting status. A node that restarts finds its records in transitional
// states (Service.Start) and drives each to available or error, and a node
// that is gone for good has its records adopted by a live one (orphans.go),
// so none stays transitional.
//
// Ownership: a caller sees only records it owns (admin sees all). A record
// the caller may not see is reported exactly as one that does not exist.
//
// Callers: the api package (one Service per node).
package volume
