package cli

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/api"
)

// exportAPI is a fake API whose snapshot "s" runs an export through the
// answers in steps (nil: the export ended well), then keeps answering the
// last one.
func exportAPI(t *testing.T, steps []*api.Progress, after http.HandlerFunc) (endpoint, identity string) {
	polls := new(atomic.Int32)
	return fakeAPI(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sn := api.Snapshot{ID: "snap-0000000000000001", Name: "s", Status: "available"}
		if r.Method == "POST" {
			sn.Progress = steps[0]
		} else {
			n := int(polls.Add(1))
			if n > len(steps) && after != nil {
				after(w, r)
				return
			}
			sn.Progress = steps[min(n, len(steps))-1]
		}
		if sn.Progress == nil {
			sn.LastJob = &api.JobResult{Job: "export"}
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(sn)
	}))
}

// TestWaitProgressNotTerminal: --wait writing its progress into a
// file or pipe (a log) prints lines, not a bar redrawn with carriage
// returns at every poll, and ends at 100 % when the job succeeded.
func TestWaitProgressNotTerminal(t *testing.T) {
	copy40 := &api.Progress{Job: "export", Phase: "copy", Percent: 40}
	sum60 := &api.Progress{Job: "export", Phase: "checksum", Percent: 60}
	ep, id := exportAPI(t, []*api.Progress{copy40, copy40, copy40, sum60, sum60, nil}, nil)
	r := run(ep, id, "snapshot", "export", "s", "--to", "s3://b/k", "--wait")
	if r.code != 0 {
		t.Fatalf("export --wait: %+v", r)
	}
	if strings.Contains(r.stderr, "\r") {
		t.Errorf("progress into a non-terminal holds carriage returns: %q", r.stderr)
	}
	lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
	seen := map[string]bool{}
	for _, l := range lines {
		if seen[l] {
			t.Errorf("progress line %q printed twice: %q", l, r.stderr)
		}
		seen[l] = true
	}
	if last := lines[len(lines)-1]; !strings.Contains(last, "100.0%") {
		t.Errorf("progress of a finished export ends with %q, not at 100%%: %q", last, r.stderr)
	}
}

// TestProgressBarTerminal: on a terminal the bar is one line redrawn
// in place, and a finished job leaves it at 100 %.
func TestProgressBarTerminal(t *testing.T) {
	var b bytes.Buffer
	bar := &progressBar{w: &b, tty: true}
	bar.draw(&api.Progress{Job: "flatten", Percent: 10})
	bar.draw(&api.Progress{Job: "flatten", Percent: 20})
	bar.finish(true)
	out := b.String()
	if strings.Count(out, "\n") != 1 || !strings.HasSuffix(out, "\n") {
		t.Errorf("terminal bar: %q; want one line, redrawn", out)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\r")
	if last := lines[len(lines)-1]; !strings.Contains(last, "100.0%") {
		t.Errorf("terminal bar of a finished job ends with %q", last)
	}
}

// TestWaitErrorOwnLine: an error while waiting (the node went away)
// goes on a line of its own, not onto the progress line, and says that the
// job itself was not stopped.
func TestWaitErrorOwnLine(t *testing.T) {
	running := &api.Progress{Job: "export", Phase: "copy", Percent: 40}
	ep, id := exportAPI(t, []*api.Progress{running, running}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		json.NewEncoder(w).Encode(api.ErrorBody{Error: api.ErrorDetail{Code: "MetadataUnavailable", Message: "no quorum"}})
	})
	r := run(ep, id, "snapshot", "export", "s", "--to", "s3://b/k", "--wait")
	if r.code != 1 || !strings.Contains(r.stderr, "(MetadataUnavailable)") {
		t.Fatalf("export --wait, the node failing meanwhile: %+v", r)
	}
	i := strings.Index(r.stderr, "error: ")
	if i > 0 && r.stderr[i-1] != '\n' {
		t.Errorf("the error shares the progress line: %q", r.stderr)
	}
	if !strings.Contains(r.stderr, "basalt snapshot show") {
		t.Errorf("the error does not say how to follow the job that goes on: %q", r.stderr)
	}
}

// TestWaitInterrupt: Ctrl-C stops the waiting, not the job, and
// says so.
func TestWaitInterrupt(t *testing.T) {
	// The test process must survive its SIGINT whether or not the CLI
	// catches it.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt)
	defer signal.Stop(sig)

	running := &api.Progress{Job: "flatten", Percent: 40}
	polls := new(atomic.Int32)
	ep, id := fakeAPI(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if polls.Add(1) == 3 {
			syscall.Kill(os.Getpid(), syscall.SIGINT)
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(api.Volume{ID: "vol-0000000000000001", Status: "available", Progress: running})
	}))
	done := make(chan runResult, 1)
	go func() { done <- run(ep, id, "volume", "flatten", "v", "--wait") }()
	select {
	case r := <-done:
		if r.code != 1 || !strings.Contains(r.stderr, "(Interrupted)") || !strings.Contains(r.stderr, "basalt volume show") {
			t.Errorf("flatten --wait interrupted: %+v; want Interrupted, saying how to follow the job", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("flatten --wait goes on waiting after SIGINT")
	}
}
