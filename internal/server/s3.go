package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/basalt-storage/basalt/internal/objects"
	"github.com/versity/versitygw/s3api"
	"github.com/versity/versitygw/s3api/middlewares"
)

// s3Region is the region the gateway answers for; clients must sign for it.
const s3Region = "us-east-1"

// s3URL is the gateway's URL as clients should use it (s3.env): https
// when it serves TLS (s3_tls.go).
func (n *Node) s3URL() string {
	host, port, err := n.s3Host()
	if err != nil {
		return ""
	}
	scheme := "http"
	if n.cfg.s3UsesTLS() {
		scheme = "https"
	}
	return scheme + "://" + net.JoinHostPort(host, port)
}

// startS3 serves the object store over S3 on cfg.S3 with versitygw's
// protocol layer, basalt's backend (package objects) and basalt's users
// as IAM, over HTTPS unless on loopback or told otherwise (s3_tls.go).
// Every node serves it; all state is in etcd and the store.
func (n *Node) startS3() error {
	if err := n.cfg.S3TLSConfig.check(); err != nil {
		return err
	}
	useTLS, caBundle := n.cfg.s3UsesTLS(), false
	var tlsOpt s3api.Option
	if useTLS {
		var err error
		if tlsOpt, caBundle, err = n.s3TLS(); err != nil {
			return err
		}
	}
	url := n.s3URL()
	// New identities, and this node's admin identity if written before
	// (another URL, plain HTTP), point at the gateway as it now serves.
	n.users.SetS3(url, s3Region)
	n.users.SetS3CABundle(caBundle)
	if err := n.refreshS3Env(url, caBundle); err != nil {
		n.log.Warn("admin identity's s3.env not updated", "dir", n.AdminDir, "err", err)
	}
	// Every request resolves its access key and its bucket's owner: from
	// node-local mirrors of those records, not from the etcd leader.
	ctx, cancel := context.WithCancel(context.Background())
	n.s3Stop = cancel
	be, err := objects.New(objects.Config{
		Root: n.store.BucketsDir(), Work: n.store.ObjectsDir(),
		Buckets: objects.MetaBuckets{Meta: n.meta, Mirror: n.meta.MirrorBuckets(ctx), Users: n.usersByName},
		Log:     n.log.With("component", "s3"), TrustFile: n.cfg.S3TrustFile,
	})
	if err != nil {
		return fmt.Errorf("object store: %w", err)
	}
	n.objects = be
	// versitygw's root account bypasses every check; basalt admins are S3
	// admins through IAM instead, so root gets a key nobody knows.
	root := middlewares.RootUserConfig{Access: "basalt-root-" + randomID(), Secret: randomID() + randomID() + randomID()}
	opts := []s3api.Option{
		s3api.WithConcurrencyLimiter(65536, 4096),
		s3api.WithKeepAlive(),
		s3api.WithQuiet(),
		s3api.WithDisableACL(),
		s3api.WithHealth("/healthz"), // for load balancers; no bucket can be named healthz
		// Clear answers for keys s3api refuses itself, and the version id
		// of a delete marker's answers (objects.Middleware).
		s3api.WithMiddleware("/", objects.Middleware()),
	}
	if n.metrics != nil {
		opts = append(opts, s3api.WithMiddleware("/", newS3Metrics(n.metrics).middleware()))
	}
	if tlsOpt != nil {
		opts = append(opts, tlsOpt)
	}
	iam := &objects.IAM{Meta: n.meta, Users: n.meta.MirrorUsersByAccessKey(ctx)}
	build := func(onListen s3api.Option) (*s3api.S3ApiServer, error) {
		return s3api.New(be, root, s3Region, iam, nil, nil, nil, nil, append(opts[:len(opts):len(opts)], onListen)...)
	}
	n.releaseS3()
	srv, failed, err := n.serveS3(build)
	if err != nil {
		return err
	}
	n.s3.Store(srv)
	n.log.Info("s3 serving", "addr", n.cfg.S3, "url", url, "tls", useTLS, "cluster_ca_cert", caBundle)
	go n.superviseS3(srv, failed, build)
	return nil
}

// s3Builder makes a gateway, with an option that tells when it listens.
type s3Builder func(onListen s3api.Option) (*s3api.S3ApiServer, error)

// serveS3 starts a gateway that build makes on cfg.S3 and returns once it
// listens; failed receives the end of its serving.
func (n *Node) serveS3(build s3Builder) (srv *s3api.S3ApiServer, failed <-chan error, err error) {
	listening := make(chan struct{})
	if srv, err = build(s3api.WithOnListen(func() { close(listening) })); err != nil {
		return nil, nil, fmt.Errorf("s3 server: %w", err)
	}
	ended := make(chan error, 1)
	go func() { ended <- srv.ServeMultiPort([]string{n.cfg.S3}) }()
	select {
	case <-listening:
		return srv, ended, nil
	case err := <-ended:
		return nil, nil, fmt.Errorf("s3 listen %s: %w", n.cfg.S3, err)
	case <-time.After(30 * time.Second):
		srv.ShutDown()
		return nil, nil, errors.New("s3 server did not start listening within 30s")
	}
}

// superviseS3 starts the gateway again when its serving ends unasked: the
// HTTP server under it (fasthttp) stops on any accept error but a
// timeout — EMFILE among them — so running out of file descriptors for a
// moment would otherwise end S3 on this node until a restart. Shutting
// the server down ends its serving too (s3Closing says it was asked).
// Close sets s3Closing before it loads the server to shut down, and this
// stores a new one before it looks at s3Closing: one of the two shuts a
// gateway started during a Close down.
func (n *Node) superviseS3(srv *s3api.S3ApiServer, failed <-chan error, build s3Builder) {
	for {
		err := <-failed
		if n.s3Closing.Load() {
			return
		}
		n.log.Error("s3 server stopped; starting it again", "addr", n.cfg.S3, "err", err)
		srv.ShutDown() // what is left of its listeners goes, freeing the port
		for {
			time.Sleep(time.Second)
			if n.s3Closing.Load() {
				return
			}
			if srv, failed, err = n.serveS3(build); err == nil {
				break
			}
			n.log.Error("s3 server did not start again; retrying", "addr", n.cfg.S3, "err", err)
		}
		n.s3.Store(srv)
		if n.s3Closing.Load() {
			srv.ShutDown()
			return
		}
		n.log.Info("s3 serving again", "addr", n.cfg.S3)
	}
}
