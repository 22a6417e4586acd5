package e2e

import (
	"io"
	"net/http"
	"syscall"
	"testing"
	"time"
)

// TestSecondSignalStopsAtOnce: a server's shutdown waits for what is under
// way (here an API request whose body never ends, as one from a client
// that hangs); a second SIGTERM must end the process at once, as an
// operator expects — it was swallowed, and only SIGKILL could.
func TestSecondSignalStopsAtOnce(t *testing.T) {
	n := StartNode(t, NodeOptions{})
	c := identityHTTP(t, n.AdminDir())
	body, feed := io.Pipe()
	defer feed.Close()
	req, err := http.NewRequest("POST", n.Endpoint()+"/v1/volumes", body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	go func() {
		if resp, err := c.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	if _, err := feed.Write([]byte("{")); err != nil { // the request is in, its body not
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)

	n.cmd.Process.Signal(syscall.SIGTERM)
	time.Sleep(time.Second)
	if !n.Running() {
		t.Fatal("the shutdown did not wait for the hanging request: the test cannot tell whether a second signal cuts it short")
	}
	start := time.Now()
	n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(3 * time.Second):
		n.cmd.Process.Kill()
		<-n.done
		t.Fatal("a second SIGTERM did not end the shutdown")
	}
	t.Logf("ended %v after the second SIGTERM (%v)", time.Since(start), n.cmd.ProcessState)
}
