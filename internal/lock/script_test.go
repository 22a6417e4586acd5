package lock

// Script tests: testdata/*.txt, one command per line, run against the model
// and the real service in lock step (the harness checks they agree after
// every line) and against the expectation written after "->".
//
//	a acquire read -> granted      outcome: granted, waits, conflict, ok
//	b acquire write -> waits
//	a release                      no "->": outcome must be ok
//	woken -> b                     pending clients whose watched key changed
//	b poll -> granted
//	queue -> b:write               the etcd queue, oldest first
//
// Blank lines and lines starting with # are ignored.

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

func TestScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) {
			runScript(t, f)
		})
	}
}

func runScript(t *testing.T, file string) {
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, 4)
	defer h.close()
	h.reset("r")
	for n, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		cmd, want, found := strings.Cut(line, "->")
		cmd, want = strings.TrimSpace(cmd), strings.TrimSpace(want)
		if !found {
			want = "ok"
		}
		var got string
		switch cmd {
		case "queue":
			q, err := h.queue()
			if err != nil {
				t.Fatalf("%s:%d: %v", file, n+1, err)
			}
			got = strings.Join(q, " ")
		case "woken":
			w, err := h.woken()
			if err != nil {
				t.Fatalf("%s:%d: %v", file, n+1, err)
			}
			var names []string
			for c, ok := range w {
				if ok {
					names = append(names, clientName(c))
				}
			}
			sort.Strings(names)
			got = strings.Join(names, " ")
		default:
			o, err := parseOp(cmd)
			if err != nil {
				t.Fatalf("%s:%d: %v", file, n+1, err)
			}
			got, err = h.do(o)
			if err != nil {
				t.Fatalf("%s:%d: %v", file, n+1, err)
			}
		}
		if got != want {
			t.Fatalf("%s:%d: %s: got %q, want %q", file, n+1, cmd, got, want)
		}
	}
}
