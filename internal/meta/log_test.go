package meta

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"go.uber.org/zap"
)

// Export names are etcd keys; etcd's slow-request warnings quote keys.
// None of them may reach basalt's log.
func TestEtcdLogsRedactKeys(t *testing.T) {
	var buf bytes.Buffer
	z := newZapLogger(slog.New(slog.NewTextHandler(&buf, nil)))
	secret := "/basalt/exports/teyxiwxtah6akygmvtcqmw5rmoflejqv"
	z.Warn("request stats", zap.String("request content", `compare:<key:"`+secret+`">`), zap.Int("request count", 3))
	z.Warn("apply request took too long", zap.String("request", "key:"+secret), zap.String("prefix", "read-only range "))
	z.Warn("something new", zap.String("whatever", secret))
	out := buf.String()
	if strings.Contains(out, "teyxiwxtah6akygmvtcqmw5rmoflejqv") {
		t.Fatalf("a key reached the log:\n%s", out)
	}
	if !strings.Contains(out, "request stats") || !strings.Contains(out, `"request count"=3`) {
		t.Fatalf("the warnings themselves were lost:\n%s", out)
	}
}
