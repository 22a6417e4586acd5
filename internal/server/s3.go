package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/basalt-storage/basalt/internal/objects"
	"github.com/versity/versitygw/s3api"
	"github.com/versity/versitygw/s3api/middlewares"
)

// s3Region is the region the gateway answers for; clients must sign for it.
const s3Region = "us-east-1"

// s3URL is the gateway's URL as clients should use it (s3.env).
func (n *Node) s3URL() string {
	host, port, err := net.SplitHostPort(n.cfg.S3)
	if err != nil {
		return ""
	}
	if n.cfg.Advertise != "" {
		host = n.cfg.Advertise
	} else if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host, _ = os.Hostname()
	}
	return "http://" + net.JoinHostPort(host, port)
}

// startS3 serves the object store over S3 on cfg.S3 with versitygw's
// protocol layer, basalt's backend (package objects) and basalt's users
// as IAM. Every node serves it; all state is in etcd and the store.
func (n *Node) startS3() error {
	// Every request resolves its access key and its bucket's owner: from
	// node-local mirrors of those records, not from the etcd leader.
	ctx, cancel := context.WithCancel(context.Background())
	n.s3Stop = cancel
	be, err := objects.New(objects.Config{
		Root: n.store.BucketsDir(), Work: n.store.ObjectsDir(),
		Buckets: objects.MetaBuckets{Meta: n.meta, Mirror: n.meta.MirrorBuckets(ctx), Users: n.meta.MirrorUsersByName(ctx)},
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
	srv, err := s3api.New(be, root, s3Region, &objects.IAM{Meta: n.meta, Users: n.meta.MirrorUsersByAccessKey(ctx)}, nil, nil, nil, nil,
		s3api.WithConcurrencyLimiter(65536, 4096),
		s3api.WithKeepAlive(),
		s3api.WithQuiet(),
		s3api.WithDisableACL(),
		s3api.WithHealth("/healthz"), // for load balancers; no bucket can be named healthz
		s3api.WithOnListen(func() { close(listening) }),
	)
	if err != nil {
		return fmt.Errorf("s3 server: %w", err)
	}
	failed := make(chan error, 1)
	go func() { failed <- srv.ServeMultiPort([]string{n.cfg.S3}) }()
	select {
	case <-listening:
	case err := <-failed:
		return fmt.Errorf("s3 listen %s: %w", n.cfg.S3, err)
	case <-time.After(30 * time.Second):
		return errors.New("s3 server did not start listening within 30s")
	}
	n.s3 = srv
	go func() {
		if err := <-failed; err != nil {
			n.log.Error("s3 server stopped", "err", err)
		}
	}()
	return nil
}
