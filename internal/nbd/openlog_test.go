package nbd

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
)

// countingHandler counts the records logged at Info or above.
type countingHandler struct{ n *atomic.Int32 }

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelInfo {
		h.n.Add(1)
	}
	return nil
}
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countingHandler) WithGroup(string) slog.Handler      { return h }

// A client may ask for any number of export names in one handshake
// (guessing them, say): the node's log must not take a line for each.
func TestFailedOpensLogOncePerConnection(t *testing.T) {
	dev, _ := sparseFile(t, testSize)
	var n atomic.Int32
	_, addr := serve(t, dev, func(s *Server) { s.Log = slog.New(countingHandler{&n}) })
	c := connect(t, addr, clientFixed|clientNoZeroes)
	for range 100 {
		c.final(optInfo, encInfoGo("guess"), repErrUnknown)
		c.final(optGo, encInfoGo("guess"), repErrUnknown)
	}
	c.goExport("disk")
	c.mustRead(0, 512)
	if got := n.Load(); got > 1 {
		t.Errorf("%d log records at Info or above for 200 failed opens on one connection, want 1", got)
	}
}
