package meta

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
)

// cutProxy forwards TCP connections to the test member until Cut: then it
// closes every connection and refuses new ones, as a partition between a
// node and etcd does (etcd's client keeps trying to reconnect, and a
// request waits for a connection while its context lasts).
type cutProxy struct {
	addr string
	l    net.Listener

	mu    sync.Mutex
	cut   bool
	conns []net.Conn
}

// newCutProxy proxies the test member's client URL; its URL is
// "https://"+addr (the member's certificate names 127.0.0.1).
func newCutProxy(t *testing.T) *cutProxy {
	t.Helper()
	openTestStore(t)
	u, err := url.Parse(testEnv.clientURL)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{addr: l.Addr().String(), l: l}
	t.Cleanup(func() { l.Close(); p.Cut() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go p.serve(c, u.Host)
		}
	}()
	return p
}

func (p *cutProxy) serve(c net.Conn, target string) {
	if !p.track(c) {
		return
	}
	up, err := net.Dial("tcp", target)
	if err != nil || !p.track(up) {
		c.Close()
		return
	}
	go func() { io.Copy(up, c); up.Close() }()
	io.Copy(c, up)
	c.Close()
}

// track remembers c for Cut; false (c closed) if cut already.
func (p *cutProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		c.Close()
		return false
	}
	p.conns = append(p.conns, c)
	return true
}

// Cut closes every connection through the proxy and refuses new ones.
func (p *cutProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}
