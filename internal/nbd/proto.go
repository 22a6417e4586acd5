// Package nbd is basalt's NBD server: the fixed-newstyle handshake with
// option haggling (EXPORT_NAME, ABORT, LIST, STARTTLS, INFO, GO,
// STRUCTURED_REPLY, LIST_META_CONTEXT, SET_META_CONTEXT) and the
// transmission phase (READ, WRITE, FLUSH, TRIM, WRITE_ZEROES with
// FAST_ZERO, BLOCK_STATUS for base:allocation, CACHE, DISC), written from
// the NBD project's protocol specification (doc/proto.md).
//
// It knows nothing of volumes: an Exports implementation maps an export
// name to a block.Device and says when the export is revoked.
//
// Per connection, one goroutine at a time holds the reader's role
// (conn.go): it reads requests and runs them concurrently, many in
// flight, replies out of order. Reads the device can answer without
// waiting (page-cache hits, block.NoWaitReader) it runs itself, and small
// writes too, one after another, which is what a file's lock would make
// of them anyway (watchdog.go); if such a write is slow, a watchdog hands
// the reader's role to a new goroutine after a millisecond. Other reads
// and commands get a goroutine each; a big write is run by the goroutine
// that received its payload, which first hands the reader's role to a new
// goroutine, so the payload is copied on from a warm cache.
// A big read from a device that offers block.Splicer is spliced from the
// page cache into the socket, never copied through a buffer (splice.go).
// A big payload is received with the socket's low-water mark set
// (socket.go), one wakeup per payload. Each goroutine writes its own
// reply under the connection's write lock, and the last of a convoy of
// waiting writers flushes, so replies that finish together share system
// calls; the reader flushes what it answered itself before it next waits.
//
// Invariants:
//   - memory per connection is bounded: at most MaxInFlight requests and
//     MaxInFlightBytes of payload are held at once; the reader stops
//     reading until earlier requests finish;
//   - so is payload memory across connections: at most
//     MaxInFlightBytesTotal is held at once, connections waiting their
//     turn first come, first served (serverbudget.go);
//   - malformed input on one connection ends at most that connection;
//   - a reply to FLUSH is sent only after every write replied to before the
//     FLUSH arrived is durable; a FUA write is durable before its reply;
//   - a revoked export's connections are closed, and it is never served
//     again.
package nbd

import (
	"encoding/binary"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Magic numbers.
const (
	magicNBD        = 0x4e42444d41474943 // "NBDMAGIC"
	magicOpt        = 0x49484156454F5054 // "IHAVEOPT"
	magicOptReply   = 0x3e889045565a9
	magicRequest    = 0x25609513
	magicSimple     = 0x67446698
	magicStructured = 0x668e33ef
)

// Handshake flags (server) and client flags.
const (
	flagFixedNewstyle = 1 << 0
	flagNoZeroes      = 1 << 1
	clientFixed       = 1 << 0
	clientNoZeroes    = 1 << 1
)

// Transmission flags.
const (
	tflagHasFlags     = 1 << 0
	tflagReadOnly     = 1 << 1
	tflagSendFlush    = 1 << 2
	tflagSendFUA      = 1 << 3
	tflagRotational   = 1 << 4
	tflagSendTrim     = 1 << 5
	tflagSendZeroes   = 1 << 6
	tflagSendDF       = 1 << 7
	tflagMultiConn    = 1 << 8
	tflagSendCache    = 1 << 10
	tflagSendFastZero = 1 << 11
)

// Options.
const (
	optExportName      = 1
	optAbort           = 2
	optList            = 3
	optStartTLS        = 5
	optInfo            = 6
	optGo              = 7
	optStructuredReply = 8
	optListMetaContext = 9
	optSetMetaContext  = 10
)

// Option replies.
const (
	repAck         = 1
	repServer      = 2
	repInfo        = 3
	repMetaContext = 4
	repErr         = 1 << 31
	repErrUnsup    = repErr + 1
	repErrPolicy   = repErr + 2
	repErrInvalid  = repErr + 3
	repErrPlatform = repErr + 4
	repErrTLSReqd  = repErr + 5
	repErrUnknown  = repErr + 6
	repErrShutdown = repErr + 7
	repErrTooBig   = repErr + 9
)

// Info types.
const (
	infoExport      = 0
	infoName        = 1
	infoDescription = 2
	infoBlockSize   = 3
)

// Commands.
const (
	cmdRead        = 0
	cmdWrite       = 1
	cmdDisc        = 2
	cmdFlush       = 3
	cmdTrim        = 4
	cmdCache       = 5
	cmdWriteZeroes = 6
	cmdBlockStatus = 7
)

// Command flags.
const (
	cflagFUA      = 1 << 0
	cflagNoHole   = 1 << 1
	cflagDF       = 1 << 2
	cflagReqOne   = 1 << 3
	cflagFastZero = 1 << 4
)

// Structured reply flags and types.
const (
	replyFlagDone        = 1 << 0
	replyTypeNone        = 0
	replyTypeOffsetData  = 1
	replyTypeOffsetHole  = 2
	replyTypeBlockStatus = 5
	replyTypeError       = 1<<15 + 1
)

// Error values.
const (
	errPerm     = 1
	errIO       = 5
	errNoMem    = 12
	errInval    = 22
	errNoSpc    = 28
	errOverflow = 75
	errNotSup   = 95
	errShutdown = 108
)

// base:allocation flags.
const (
	stateHole = 1 << 0
	stateZero = 1 << 1
)

// Limits.
const (
	// MaxPayload is the largest READ or WRITE payload accepted (and
	// advertised with NBD_INFO_BLOCK_SIZE): the spec's interoperable 32 MiB.
	MaxPayload = 32 << 20
	// preferredBlock is the advertised preferred block size.
	preferredBlock = 4096
	// maxOptionLen bounds the option data read during haggling; the
	// largest option this server takes is a meta-context request with a
	// few 4 KiB strings.
	maxOptionLen = 64 << 10
	// maxSkippedOption bounds the data of an option refused for being
	// longer (readOption): discarded as it comes, it costs no memory, and
	// the spec asks that nothing up to its interoperable 32 MiB payload be
	// taken for a denial of service. Beyond, the session ends.
	maxSkippedOption = MaxPayload
	// maxString is the protocol's limit on strings.
	maxString = 4096
	// metaContextID is the id of base:allocation on every connection.
	metaContextID = 1
	// maxExtentsPerReply bounds a BLOCK_STATUS reply.
	maxExtentsPerReply = 1 << 16
)

// MetaContextAllocation is the one metadata context basalt serves.
const MetaContextAllocation = "base:allocation"

var be = binary.BigEndian

// request is a parsed transmission request header.
type request struct {
	flags  uint16
	typ    uint16
	cookie uint64
	offset uint64
	length uint32
	// start is when its header was read (since()'s clock), if the
	// export counts requests (Stats).
	start int64
}

const requestSize = 28

// parseRequest decodes a request header; ok is false on a bad magic.
func parseRequest(b []byte) (r request, ok bool) {
	if len(b) < requestSize || be.Uint32(b[0:4]) != magicRequest {
		return r, false
	}
	return request{
		flags:  be.Uint16(b[4:6]),
		typ:    be.Uint16(b[6:8]),
		cookie: be.Uint64(b[8:16]),
		offset: be.Uint64(b[16:24]),
		length: be.Uint32(b[24:28]),
	}, true
}

func commandName(t uint16) string {
	switch t {
	case cmdRead:
		return "READ"
	case cmdWrite:
		return "WRITE"
	case cmdDisc:
		return "DISC"
	case cmdFlush:
		return "FLUSH"
	case cmdTrim:
		return "TRIM"
	case cmdCache:
		return "CACHE"
	case cmdWriteZeroes:
		return "WRITE_ZEROES"
	case cmdBlockStatus:
		return "BLOCK_STATUS"
	}
	return "UNKNOWN"
}

// message formats an error message as the protocol's strings must be:
// valid UTF-8 (an export name a client sent may not be), at most maxString
// bytes, cut between characters.
func message(format string, a ...any) string {
	msg := strings.ToValidUTF8(fmt.Sprintf(format, a...), "\uFFFD")
	if len(msg) > maxString {
		msg = msg[:maxString]
		for !utf8.ValidString(msg) {
			msg = msg[:len(msg)-1]
		}
	}
	return msg
}
