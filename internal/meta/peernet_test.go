package meta

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckPeerRetransmit(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, content string
		warn          bool
	}{
		{"default", "120000\n", true},
		{"advised", "1000\n", false},
		{"unreadable", "", false}, // no file: a kernel without the setting
		{"garbage", "fast\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, tc.name)
			if tc.content != "" {
				if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			var buf bytes.Buffer
			checkPeerRetransmit(slog.New(slog.NewTextHandler(&buf, nil)), path)
			if got := strings.Contains(buf.String(), "tcp_rto_max_ms"); got != tc.warn {
				t.Errorf("warned %v, want %v: %q", got, tc.warn, buf.String())
			}
		})
	}
}
