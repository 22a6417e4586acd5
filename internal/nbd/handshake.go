package nbd

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"
)

// errAbort ends a session the client aborted (not an error to log).
var errAbort = errors.New("client aborted negotiation")

// option is one parsed option request.
type option struct {
	code uint32
	data []byte
	// tooBig: its data, longer than maxOptionLen, was discarded unread.
	tooBig bool
}

// handshake runs the fixed-newstyle negotiation and returns the export the
// client chose, or an error after which the connection must close.
func (c *conn) handshake() (*Export, error) {
	deadline := time.Now().Add(c.srv.HandshakeTimeout)
	c.nc.SetDeadline(deadline)
	defer c.nc.SetDeadline(time.Time{})
	if c.stopped.Load() { // quiesced before: its deadline was just replaced
		return nil, errStopped
	}
	// The socket's deadline does not stop Exports.Open, which a client
	// that has not authenticated can have called (and which may wait for
	// a metadata store): its context ends with the handshake's time, or
	// when the connection is shut down.
	ctx, cancel := context.WithDeadline(c.ctx, deadline)
	defer cancel()
	var hello [18]byte
	be.PutUint64(hello[0:], magicNBD)
	be.PutUint64(hello[8:], magicOpt)
	be.PutUint16(hello[16:], flagFixedNewstyle|flagNoZeroes)
	if err := c.put(hello[:], nil); err != nil {
		return nil, err
	}
	var cf [4]byte
	if _, err := io.ReadFull(c.r, cf[:]); err != nil {
		return nil, err
	}
	flags := be.Uint32(cf[:])
	if flags&^uint32(clientFixed|clientNoZeroes) != 0 {
		return nil, fmt.Errorf("client flags %#x not understood", flags)
	}
	c.fixed = flags&clientFixed != 0
	c.noZeroes = flags&clientNoZeroes != 0
	for {
		opt, err := readOption(c.r)
		if err != nil {
			return nil, err
		}
		exp, err := c.option(ctx, opt)
		if err != nil || exp != nil {
			return exp, err
		}
	}
}

// readOption reads one option request. Data longer than any option this
// server takes is discarded as it arrives rather than held (tooBig): the
// framing is sound, and the spec lets a server skip what it does not
// understand and wants such options refused, not the session dropped.
// Data beyond maxSkippedOption ends the session.
func readOption(r io.Reader) (option, error) {
	var h [16]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return option{}, err
	}
	if be.Uint64(h[0:]) != magicOpt {
		return option{}, fmt.Errorf("bad option magic %#x", be.Uint64(h[0:]))
	}
	o := option{code: be.Uint32(h[8:])}
	n := be.Uint32(h[12:])
	if n > maxSkippedOption {
		return option{}, fmt.Errorf("option %d: length %d exceeds %d", o.code, n, maxSkippedOption)
	}
	if n > maxOptionLen {
		if _, err := io.CopyN(io.Discard, r, int64(n)); err != nil {
			return option{}, fmt.Errorf("option %d: discarding %d bytes of data: %w", o.code, n, err)
		}
		o.tooBig = true
		return o, nil
	}
	o.data = make([]byte, n)
	if _, err := io.ReadFull(r, o.data); err != nil {
		return option{}, err
	}
	return o, nil
}

// reply sends one option reply (and flushes: the client waits for it).
func (c *conn) reply(opt, typ uint32, data []byte) error {
	var h [20]byte
	be.PutUint64(h[0:], magicOptReply)
	be.PutUint32(h[8:], opt)
	be.PutUint32(h[12:], typ)
	be.PutUint32(h[16:], uint32(len(data)))
	return c.put(h[:], data)
}

// put writes a and b and flushes them, under the write lock as replies
// in transmission are: shutdown may end a TLS session from another
// goroutine at any time (closeTLS), and must neither cut into a reply
// nor follow a failed write.
func (c *conn) put(a, b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil {
		return c.werr
	}
	if _, err := c.w.Write(a); err != nil {
		c.werr = err
		return err
	}
	if _, err := c.w.Write(b); err != nil {
		c.werr = err
		return err
	}
	c.werr = c.w.Flush()
	return c.werr
}

func (c *conn) replyErr(opt, typ uint32, format string, a ...any) error {
	return c.reply(opt, typ, []byte(message(format, a...)))
}

// option handles one option; it returns an export when transmission starts.
func (c *conn) option(ctx context.Context, o option) (*Export, error) {
	if c.draining.Load() {
		// The spec: a server being shut down SHOULD answer further
		// options (but ABORT) with ERR_SHUTDOWN. (Only those already
		// received: it reads no more.)
		switch o.code {
		case optAbort:
		case optExportName:
			return nil, errStopped // cannot be refused: the session ends
		default:
			return nil, c.replyErr(o.code, repErrShutdown, "the server is shutting down")
		}
	}
	if c.srv.RequireTLS && !c.tls {
		switch o.code {
		case optStartTLS, optAbort:
		case optExportName:
			return nil, errors.New("EXPORT_NAME before STARTTLS on a TLS-only server")
		default:
			if !c.tlsOffered() {
				// The session is in NOTLS mode (tlsOffered), where
				// ERR_TLS_REQD is not allowed; without TLS this server
				// serves nothing.
				return nil, c.replyErr(o.code, repErrPolicy, "this server requires TLS, which this session cannot use (it needs fixed newstyle negotiation)")
			}
			return nil, c.replyErr(o.code, repErrTLSReqd, "this server requires TLS: use STARTTLS")
		}
	}
	if o.tooBig {
		return c.refuseTooBig(o)
	}
	switch o.code {
	case optExportName:
		return c.exportName(ctx, string(o.data))
	case optAbort:
		c.reply(o.code, repAck, nil)
		return nil, errAbort
	case optList:
		if len(o.data) != 0 {
			return nil, c.replyErr(o.code, repErrInvalid, "LIST takes no data")
		}
		// Export names are per-attachment secrets: none is listed.
		return nil, c.reply(o.code, repAck, nil)
	case optStartTLS:
		return nil, c.startTLS(o)
	case optInfo, optGo:
		return c.infoGo(ctx, o)
	case optStructuredReply:
		if len(o.data) != 0 {
			return nil, c.replyErr(o.code, repErrInvalid, "STRUCTURED_REPLY takes no data")
		}
		c.structured = true
		return nil, c.reply(o.code, repAck, nil)
	case optListMetaContext, optSetMetaContext:
		return nil, c.metaContext(o)
	}
	return nil, c.replyErr(o.code, repErrUnsup, "option %d is not supported", o.code)
}

// refuseTooBig answers an option whose data readOption discarded.
func (c *conn) refuseTooBig(o option) (*Export, error) {
	switch o.code {
	case optExportName:
		// Cannot be refused; and no export has a name that long.
		return nil, fmt.Errorf("EXPORT_NAME: name of over %d bytes", maxOptionLen)
	case optAbort:
		// Its data is to be ignored.
		c.reply(o.code, repAck, nil)
		return nil, errAbort
	case optList, optStartTLS, optStructuredReply:
		// The spec's answer to these with any data.
		return nil, c.replyErr(o.code, repErrInvalid, "option %d takes no data", o.code)
	case optSetMetaContext:
		// Even a failed SET replaces the contexts selected before.
		c.metaSelected = false
	case optInfo, optGo, optListMetaContext:
	default:
		return nil, c.replyErr(o.code, repErrUnsup, "option %d is not supported", o.code)
	}
	return nil, c.replyErr(o.code, repErrTooBig, "option %d: more than %d bytes of data", o.code, maxOptionLen)
}

func (c *conn) exportName(ctx context.Context, name string) (*Export, error) {
	if len(name) > maxString {
		// No export has such a name (INFO and GO refuse it as
		// malformed); not worth a lookup by Exports.Open.
		return nil, fmt.Errorf("EXPORT_NAME: name of %d bytes exceeds the protocol's %d", len(name), maxString)
	}
	exp, err := c.srv.Exports.Open(ctx, name, c.tlsState())
	if err != nil {
		return nil, fmt.Errorf("EXPORT_NAME: %w", err) // the spec's only answer: close
	}
	if c.metaExport != name {
		c.metaSelected = false // contexts were chosen for another export
	}
	b := make([]byte, 10, 134)
	be.PutUint64(b[0:], uint64(exp.Device.Size()))
	be.PutUint16(b[8:], c.transmissionFlags(exp))
	if !c.noZeroes {
		b = b[:134]
	}
	if err := c.put(b, nil); err != nil {
		release(exp)
		return nil, err
	}
	return exp, nil
}

func (c *conn) startTLS(o option) error {
	switch {
	case c.srv.TLS == nil:
		return c.replyErr(o.code, repErrPolicy, "TLS is not configured on this server")
	case !c.fixed:
		return c.replyErr(o.code, repErrPolicy, "TLS needs fixed newstyle negotiation")
	case c.tls:
		return c.replyErr(o.code, repErrInvalid, "TLS is already active")
	case len(o.data) != 0:
		return c.replyErr(o.code, repErrInvalid, "STARTTLS takes no data")
	}
	if err := c.reply(o.code, repAck, nil); err != nil {
		return err
	}
	tc := tls.Server(c.nc, c.srv.TLS)
	if err := tc.Handshake(); err != nil {
		return fmt.Errorf("TLS handshake: %w", err)
	}
	c.nc, c.tls, c.sock = tc, true, nil // the socket now carries TLS records
	// Small until an export is chosen, as before STARTTLS (growBuffers).
	c.r = bufio.NewReaderSize(tc, handshakeBufSize)
	c.w = bufio.NewWriterSize(tc, handshakeBufSize)
	c.tlsc.Store(tc) // from now on shutdown ends the session with close_notify
	// The spec: no negotiation state survives STARTTLS.
	c.structured, c.metaSelected, c.metaExport = false, false, ""
	return nil
}

// parseInfoGo decodes INFO/GO data: name and information requests.
func parseInfoGo(d []byte) (name string, infos []uint16, ok bool) {
	if len(d) < 6 {
		return "", nil, false
	}
	n := be.Uint32(d)
	if uint64(n) > uint64(len(d)-6) || n > maxString {
		return "", nil, false
	}
	name = string(d[4 : 4+n])
	rest := d[4+n:]
	count := int(be.Uint16(rest))
	rest = rest[2:]
	if len(rest) != 2*count {
		return "", nil, false
	}
	for i := 0; i < count; i++ {
		infos = append(infos, be.Uint16(rest[2*i:]))
	}
	return name, infos, true
}

func (c *conn) infoGo(ctx context.Context, o option) (*Export, error) {
	name, infos, ok := parseInfoGo(o.data)
	if !ok {
		return nil, c.replyErr(o.code, repErrInvalid, "malformed INFO/GO request")
	}
	exp, err := c.srv.Exports.Open(ctx, name, c.tlsState())
	switch {
	case errors.Is(err, ErrTLSRequired) && c.tlsOffered() && !c.tls:
		return nil, c.replyErr(o.code, repErrTLSReqd, "export requires TLS")
	case errors.Is(err, ErrTLSRequired):
		// TLS_REQD is meaningless without TLS on offer or once it is up.
		return nil, c.replyErr(o.code, repErrPolicy, "export not available on this connection")
	case err != nil && c.draining.Load():
		// Open was cancelled by Server.Shutdown (or failed as it began).
		return nil, c.replyErr(o.code, repErrShutdown, "the server is shutting down")
	case err != nil:
		// The client hears only ERR_UNKNOWN (the reason may concern an
		// attachment it should not learn about); the log keeps the reason.
		// (Not the name: an export name is its attachment's secret.) At
		// Info once per connection: a client may try any number of names
		// within the handshake, and a line for each would let anyone
		// flood the node's log.
		c.openFailures++
		level := slog.LevelInfo
		if c.openFailures > 1 {
			level = slog.LevelDebug
		}
		c.log.Log(ctx, level, "export not opened", "err", err, "failures", c.openFailures)
		return nil, c.replyErr(o.code, repErrUnknown, "export not available")
	}
	var info [14]byte
	be.PutUint16(info[0:], infoExport)
	be.PutUint64(info[2:], uint64(exp.Device.Size()))
	be.PutUint16(info[10:], c.transmissionFlags(exp))
	err = c.reply(o.code, repInfo, info[:12])
	for _, want := range infos {
		if err != nil {
			break
		}
		switch want {
		case infoName:
			err = c.reply(o.code, repInfo, append([]byte{0, infoName}, exp.Name...))
		case infoDescription:
			if exp.Description != "" {
				// A protocol string (valid UTF-8, at most 4 KiB); the
				// description holds fields nobody bounds (a host name).
				err = c.reply(o.code, repInfo, append([]byte{0, infoDescription}, message("%s", exp.Description)...))
			}
		}
	}
	if err == nil {
		// Always state the size constraints: minimum 1 (any alignment
		// works), preferred 4 KiB, maximum payload 32 MiB.
		be.PutUint16(info[0:], infoBlockSize)
		be.PutUint32(info[2:], 1)
		be.PutUint32(info[6:], preferredBlock)
		be.PutUint32(info[10:], MaxPayload)
		err = c.reply(o.code, repInfo, info[:14])
	}
	if err != nil || o.code == optInfo {
		// An INFO is done with the export before its final answer: a
		// client that has read it finds the export released.
		release(exp)
		if err == nil {
			err = c.reply(o.code, repAck, nil)
		}
		return nil, err
	}
	if err = c.reply(o.code, repAck, nil); err != nil {
		release(exp)
		return nil, err
	}
	if c.metaSelected && c.metaExport != name {
		c.metaSelected = false
	}
	return exp, nil
}

// parseMetaContext decodes LIST/SET_META_CONTEXT data.
func parseMetaContext(d []byte) (export string, queries []string, ok bool) {
	if len(d) < 8 {
		return "", nil, false
	}
	n := be.Uint32(d)
	if uint64(n) > uint64(len(d)-8) || n > maxString {
		return "", nil, false
	}
	export = string(d[4 : 4+n])
	rest := d[4+n:]
	count := be.Uint32(rest)
	rest = rest[4:]
	for i := uint32(0); i < count; i++ {
		if len(rest) < 4 {
			return "", nil, false
		}
		q := be.Uint32(rest)
		if uint64(q) > uint64(len(rest)-4) || q > maxString {
			return "", nil, false
		}
		queries = append(queries, string(rest[4:4+q]))
		rest = rest[4+q:]
	}
	if len(rest) != 0 {
		return "", nil, false
	}
	return export, queries, true
}

func (c *conn) metaContext(o option) error {
	if !c.structured {
		return c.replyErr(o.code, repErrInvalid, "negotiate STRUCTURED_REPLY first")
	}
	export, queries, ok := parseMetaContext(o.data)
	if !ok {
		if o.code == optSetMetaContext {
			c.metaSelected = false
		}
		return c.replyErr(o.code, repErrInvalid, "malformed meta context request")
	}
	match := false
	for _, q := range queries {
		if q == MetaContextAllocation || (o.code == optListMetaContext && q == "base:") {
			match = true
		}
	}
	if o.code == optListMetaContext {
		if len(queries) == 0 || match {
			if err := c.reply(o.code, repMetaContext, append([]byte{0, 0, 0, 0}, MetaContextAllocation...)); err != nil {
				return err
			}
		}
		return c.reply(o.code, repAck, nil)
	}
	c.metaSelected, c.metaExport = match, export
	if match {
		var id [4]byte
		be.PutUint32(id[:], metaContextID)
		if err := c.reply(o.code, repMetaContext, append(id[:], MetaContextAllocation...)); err != nil {
			return err
		}
	}
	return c.reply(o.code, repAck, nil)
}

// transmissionFlags advertises exactly what the export's device supports.
func (c *conn) transmissionFlags(exp *Export) uint16 {
	caps := exp.Device.Capabilities()
	f := uint16(tflagHasFlags | tflagSendCache)
	if caps.Flush {
		f |= tflagSendFlush
	}
	if caps.FUA {
		f |= tflagSendFUA
	}
	if c.structured {
		f |= tflagSendDF // every read is answered with one chunk
	}
	if caps.MultiConn {
		f |= tflagMultiConn
	}
	if exp.ReadOnly || caps.ReadOnly {
		return f | tflagReadOnly
	}
	if caps.Trim {
		f |= tflagSendTrim
	}
	if caps.WriteZeroes {
		f |= tflagSendZeroes
		if caps.FastZero {
			f |= tflagSendFastZero
		}
	}
	return f
}

// tlsOffered reports whether this session may use TLS. The spec keeps a
// session in NOTLS mode (STARTTLS refused, ERR_TLS_REQD never sent)
// unless the client replied to the server's NBD_FLAG_FIXED_NEWSTYLE with
// NBD_FLAG_C_FIXED_NEWSTYLE.
func (c *conn) tlsOffered() bool { return c.srv.TLS != nil && c.fixed }

func (c *conn) tlsState() *tls.ConnectionState {
	if tc, ok := c.nc.(*tls.Conn); ok {
		st := tc.ConnectionState()
		return &st
	}
	return nil
}

func release(exp *Export) {
	if exp != nil && exp.Release != nil {
		exp.Release()
	}
}
