// Package errs defines basalt's typed errors: a machine-readable code, a human
// message and the class of failure that decides the HTTP status.
//
// Every service package (meta, volume, api) returns *Error for anything a
// caller could act on; anything else is an internal error. The api package
// maps Kind to an HTTP status, the client maps it back, and the CLI prints
// Code and Message. Codes are a stable contract: scripts match on them.
package errs

import (
	"errors"
	"fmt"
	"net/http"
	"syscall"
)

// Kind is the class of an error; it fixes the HTTP status.
type Kind int

const (
	KindInternal Kind = iota
	KindInvalid
	KindUnauthenticated
	KindForbidden
	KindNotFound
	KindConflict
	KindInsufficientStorage
	KindUnavailable
	KindMethodNotAllowed
)

// Status returns the HTTP status for a kind.
func (k Kind) Status() int {
	switch k {
	case KindInvalid:
		return http.StatusBadRequest
	case KindUnauthenticated:
		return http.StatusUnauthorized
	case KindForbidden:
		return http.StatusForbidden
	case KindNotFound:
		return http.StatusNotFound
	case KindConflict:
		return http.StatusConflict
	case KindInsufficientStorage:
		return http.StatusInsufficientStorage
	case KindUnavailable:
		return http.StatusServiceUnavailable
	case KindMethodNotAllowed:
		return http.StatusMethodNotAllowed
	}
	return http.StatusInternalServerError
}

// KindForStatus is the inverse of Kind.Status, used by clients.
func KindForStatus(status int) Kind {
	for k := KindInternal; k <= KindMethodNotAllowed; k++ {
		if k.Status() == status {
			return k
		}
	}
	return KindInternal
}

// Stable error codes. Add, never rename.
const (
	CodeInternal             = "InternalError"
	CodeInvalidRequest       = "InvalidRequest"
	CodeMalformedJSON        = "MalformedJSON"
	CodeInvalidSize          = "InvalidSize"
	CodeInvalidName          = "InvalidName"
	CodeShrinkNotAllowed     = "ShrinkNotAllowed"
	CodeUnknownVolumeType    = "UnknownVolumeType"
	CodeInsufficientCapacity = "InsufficientCapacity"
	CodeNotFound             = "NotFound"
	CodeNameConflict         = "NameConflict"
	CodeUserExists           = "UserExists"
	CodeVolumeInUse          = "VolumeInUse"
	CodeVolumeBusy           = "VolumeBusy"
	CodeSnapshotNotReady     = "SnapshotNotReady"
	CodeSnapshotInUse        = "SnapshotInUse"
	CodeCertificateRequired  = "CertificateRequired"
	CodeCertificateExpired   = "CertificateExpired"
	CodeCertificateUntrusted = "CertificateUntrusted"
	CodeCertificateRevoked   = "CertificateRevoked"
	CodeAdminRequired        = "AdminRequired"
	CodeMetadataUnavailable  = "MetadataUnavailable"
	CodeMethodNotAllowed     = "MethodNotAllowed"
	CodeNotReady             = "NotReady"
	CodeIdempotentMismatch   = "IdempotentParameterMismatch"
	CodeUserProtected        = "UserProtected"
	CodeAttachConflict       = "AttachConflict"
	CodeInvalidStack         = "InvalidStack"
	CodeTypeExists           = "VolumeTypeExists"
	CodeTypeProtected        = "VolumeTypeProtected"
	CodeNotSupportedByType   = "NotSupportedByVolumeType"
	CodeCrossOrigin          = "CrossOriginRequest"
	CodeStoreReadOnly        = "StoreReadOnly"
)

// Error is a typed, user-facing error.
type Error struct {
	Kind    Kind
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// New builds an *Error with a formatted message.
func New(kind Kind, code, format string, args ...any) *Error {
	return &Error{Kind: kind, Code: code, Message: fmt.Sprintf(format, args...)}
}

// NotFound is the error for a resource that does not exist or that the
// caller may not see; the two are deliberately indistinguishable.
func NotFound(what, id string) *Error {
	return New(KindNotFound, CodeNotFound, "%s %q not found", what, id)
}

// Invalid is a KindInvalid error.
func Invalid(code, format string, args ...any) *Error {
	return New(KindInvalid, code, format, args...)
}

// Conflict is a KindConflict error.
func Conflict(code, format string, args ...any) *Error {
	return New(KindConflict, code, format, args...)
}

// As extracts an *Error from err's chain.
func As(err error) (*Error, bool) {
	var e *Error
	if errors.As(err, &e) {
		return e, true
	}
	return nil, false
}

// Public is the error a caller is told of err: the *Error in its chain, or
// for a file system's refusal for want of space or quota (ENOSPC, EDQUOT
// anywhere in the chain: the store, or a directory of it, is full) a
// KindInsufficientStorage InsufficientCapacity error naming it — something
// the caller can act on by freeing space, not a fault of the server's —
// for a read-only file system (EROFS) an Unavailable StoreReadOnly, and
// for a file larger than the file system allows (EFBIG) InvalidSize. It
// reports false for anything else (an internal error). Unlike As it is for
// answering, not for deciding: a workflow that asks As whether a
// transaction refused itself must not take a full disk for a refusal.
func Public(err error) (*Error, bool) {
	if e, ok := As(err); ok {
		return e, true
	}
	switch {
	case errors.Is(err, syscall.ENOSPC):
		return New(KindInsufficientStorage, CodeInsufficientCapacity,
			"the store's file system has no space left: %v; free space on it (or delete volumes, snapshots or objects) and retry", err), true
	case errors.Is(err, syscall.EDQUOT):
		return New(KindInsufficientStorage, CodeInsufficientCapacity,
			"a file system quota of the store is exhausted: %v; raise the quota or free space under it and retry", err), true
	case errors.Is(err, syscall.EROFS):
		// A file system remounts itself read-only after an error (ext4's
		// errors=remount-ro, an evicted parallel file system client):
		// nothing the caller can fix, nor a fault of this request.
		return New(KindUnavailable, CodeStoreReadOnly,
			"the store's file system is read-only (remounted read-only after an error?): %v; the store's administrator must check it and make it writable again", err), true
	case errors.Is(err, syscall.EFBIG):
		// ext4's files end at 16 TiB (4 KiB blocks), for one.
		return New(KindInvalid, CodeInvalidSize,
			"the store's file system cannot hold a file that large: %v; choose a smaller size, or a volume type that spreads a volume over several files (striped, parity)", err), true
	}
	return nil, false
}

// IsCode reports whether err carries the given code.
func IsCode(err error, code string) bool {
	e, ok := As(err)
	return ok && e.Code == code
}
