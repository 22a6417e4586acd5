package meta

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// slogCore sends etcd's zap logs into basalt's slog handler, so that a node
// writes one structured log stream. etcd logs at Info in large volumes, so
// only warnings and errors pass, minus the ones that say nothing to a basalt
// operator (see benign).
type slogCore struct {
	h     slog.Handler
	attrs []slog.Attr
}

func newZapLogger(log *slog.Logger) *zap.Logger {
	return zap.New(&slogCore{h: log.With("component", "etcd").Handler()})
}

func (c *slogCore) Enabled(l zapcore.Level) bool { return l >= zapcore.WarnLevel }

func (c *slogCore) With(fields []zapcore.Field) zapcore.Core {
	return &slogCore{h: c.h, attrs: append(append([]slog.Attr{}, c.attrs...), toAttrs(fields)...)}
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	attrs := append(append([]slog.Attr{}, c.attrs...), toAttrs(fields)...)
	if benign(e.Message, attrs) {
		return nil
	}
	level := slog.LevelWarn
	if e.Level >= zapcore.ErrorLevel {
		level = slog.LevelError
	}
	r := slog.NewRecord(e.Time, level, e.Message, 0)
	r.AddAttrs(attrs...)
	return c.h.Handle(context.Background(), r)
}

func (c *slogCore) Sync() error { return nil }

// secretFields are etcd log fields that may quote keys or values; any
// other field whose value mentions a basalt key is redacted too (etcd's
// "request stats" warning quotes whole transactions under varying names).
var secretFields = map[string]bool{"request": true, "response": true, "request content": true, "key": true, "range_begin": true, "range_end": true}

func toAttrs(fields []zapcore.Field) []slog.Attr {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fields {
		f.AddTo(enc)
	}
	out := make([]slog.Attr, 0, len(enc.Fields))
	for k, v := range enc.Fields {
		if secretFields[k] || strings.Contains(fmt.Sprint(v), Prefix) {
			// etcd quotes whole requests ("apply request took too long"):
			// their keys include export secrets, which must never be logged.
			v = "[redacted]"
		}
		out = append(out, slog.Any(k, v))
	}
	return out
}

// benign recognises etcd messages that are expected in basalt's setup: its
// listeners reporting their own close at shutdown, and start-up advice that
// does not apply (basalt enables no etcd auth, so the token type is moot; the
// client port is TLS-only and private to basalt).
func benign(msg string, attrs []slog.Attr) bool {
	switch msg {
	case "simple token is not cryptographically signed",
		"Running http and grpc server on single port. This is not recommended for production.":
		return true
	}
	for _, a := range attrs {
		if a.Key == "error" {
			v := a.Value.String()
			if strings.Contains(v, "use of closed network connection") || strings.Contains(v, "http: Server closed") {
				return true
			}
		}
	}
	return false
}
