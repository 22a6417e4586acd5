package server

import (
	"fmt"
	"net"
)

// ports holds the node's service listeners from the first step of Start
// until each service takes its own. They are bound before the embedded
// etcd member, whose HTTP endpoint listens on a port the kernel chooses
// (--etcd-http unset): bound later, a service port inside the kernel's
// ephemeral range — freed a moment ago by this node's previous run — could
// be handed to the member, and the node would fail to start.
type ports struct {
	api, nbd, metrics net.Listener
	// s3 only holds the gateway's port: versitygw binds its own listener
	// from an address, so the hold is closed just before it does (release).
	s3 net.Listener
}

// bindPorts binds the API, NBD, S3 and metrics addresses of cfg. A port 0 in the
// S3 address is replaced by the one bound, so the gateway, its URL in
// s3.env and its certificate all name the same port.
func (n *Node) bindPorts() error {
	var err error
	if n.ports.api, err = net.Listen("tcp", n.cfg.API); err != nil {
		return fmt.Errorf("api listen %s: %w", n.cfg.API, err)
	}
	if n.ports.nbd, err = net.Listen("tcp", n.cfg.NBD); err != nil {
		return fmt.Errorf("nbd listen %s: %w", n.cfg.NBD, err)
	}
	if n.ports.s3, err = net.Listen("tcp", n.cfg.S3); err != nil {
		return fmt.Errorf("s3 listen %s: %w", n.cfg.S3, err)
	}
	if n.cfg.Metrics != "" {
		if n.ports.metrics, err = net.Listen("tcp", n.cfg.Metrics); err != nil {
			return fmt.Errorf("metrics listen %s: %w", n.cfg.Metrics, err)
		}
	}
	if host, port, err := net.SplitHostPort(n.cfg.S3); err == nil && port == "0" {
		_, bound, _ := net.SplitHostPort(n.ports.s3.Addr().String())
		n.cfg.S3 = net.JoinHostPort(host, bound)
	}
	return nil
}

// releaseS3 closes the hold on the S3 port for the gateway to bind it.
func (n *Node) releaseS3() {
	if n.ports.s3 != nil {
		n.ports.s3.Close()
		n.ports.s3 = nil
	}
}

// closePorts closes the listeners no service has taken over (a start
// that failed part way).
func (n *Node) closePorts() {
	for _, ln := range []*net.Listener{&n.ports.api, &n.ports.nbd, &n.ports.s3, &n.ports.metrics} {
		if *ln != nil {
			(*ln).Close()
			*ln = nil
		}
	}
}
