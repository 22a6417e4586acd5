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
	listening := make(chan struct{})
	opts := []s3api.Option{
		s3api.WithConcurrencyLimiter(65536, 4096),
		s3api.WithKeepAlive(),
		s3api.WithQuiet(),
		s3api.WithDisableACL(),
		s3api.WithHealth("/healthz"), // for load balancers; no bucket can be named healthz
		// Clear answers for keys s3api refuses itself, and the version id
		// of a delete marker's answers (objects.Middleware).
		s3api.WithMiddleware("/", objects.Middleware()),
		s3api.WithOnListen(func() { close(listening) }),
	}
	if n.metrics != nil {
		opts = append(opts, s3api.WithMiddleware("/", newS3Metrics(n.metrics).middleware()))
	}
	if tlsOpt != nil {
		opts = append(opts, tlsOpt)
	}
	srv, err := s3api.New(be, root, s3Region, &objects.IAM{Meta: n.meta, Users: n.meta.MirrorUsersByAccessKey(ctx)}, nil, nil, nil, nil, opts...)
	if err != nil {
		return fmt.Errorf("s3 server: %w", err)
	}
	failed := make(chan error, 1)
	n.releaseS3()
	go func() { failed <- srv.ServeMultiPort([]string{n.cfg.S3}) }()
	select {
	case <-listening:
	case err := <-failed:
		return fmt.Errorf("s3 listen %s: %w", n.cfg.S3, err)
	case <-time.After(30 * time.Second):
		return errors.New("s3 server did not start listening within 30s")
	}
	n.s3 = srv
	n.log.Info("s3 serving", "addr", n.cfg.S3, "url", url, "tls", useTLS, "cluster_ca_cert", caBundle)
	go func() {
		// Shutting the server down ends its serving with an error too
		// ("listener closed"): only an end nobody asked for is one.
		if err := <-failed; err != nil && !n.s3Closing.Load() {
			n.log.Error("s3 server stopped", "err", err)
		}
	}()
	return nil
}
