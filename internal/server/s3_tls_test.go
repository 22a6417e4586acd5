package server

import (
	"testing"

	"github.com/basalt-storage/basalt/internal/errs"
)

func TestS3UsesTLS(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want bool
	}{
		{Config{S3: "127.0.0.1:9000"}, false},
		{Config{S3: "[::1]:9000"}, false},
		{Config{S3: "localhost:9000"}, false},
		{Config{S3: "127.0.0.1:9000", S3TLSConfig: S3TLSConfig{S3TLS: true}}, true},
		{Config{S3: "127.0.0.1:9000", S3TLSConfig: S3TLSConfig{S3Cert: "c", S3Key: "k"}}, true},
		{Config{S3: ":9000"}, true},
		{Config{S3: "0.0.0.0:9000"}, true},
		{Config{S3: "[::]:9000"}, true},
		{Config{S3: "192.0.2.7:9000"}, true},
		{Config{S3: "no-such-host.invalid:9000"}, true},
		{Config{S3: ":9000", S3TLSConfig: S3TLSConfig{S3Insecure: true}}, false},
		{Config{S3: "192.0.2.7:9000", S3TLSConfig: S3TLSConfig{S3Insecure: true}}, false},
	} {
		if got := c.cfg.s3UsesTLS(); got != c.want {
			t.Errorf("%+v: TLS %v, want %v", c.cfg, got, c.want)
		}
	}
}

func TestS3TLSConfigCheck(t *testing.T) {
	for _, ok := range []S3TLSConfig{{}, {S3TLS: true}, {S3Insecure: true}, {S3Cert: "c", S3Key: "k"}, {S3TLS: true, S3Cert: "c", S3Key: "k"}} {
		if err := ok.check(); err != nil {
			t.Errorf("%+v: %v", ok, err)
		}
	}
	for _, bad := range []S3TLSConfig{{S3Cert: "c"}, {S3Key: "k"}, {S3Insecure: true, S3TLS: true}, {S3Insecure: true, S3Cert: "c", S3Key: "k"}} {
		if err := bad.check(); !errs.IsCode(err, usageCode) {
			t.Errorf("%+v: %v, want %s", bad, err, usageCode)
		}
	}
}
