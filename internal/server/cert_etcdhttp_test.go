package server

import (
	"slices"
	"testing"
)

// TestCertNamesEtcdHTTPHost: --etcd-http serves the member's /metrics and
// /health over TLS with the node certificate, so a monitoring system
// pointed at that address verifies the certificate against its host.
// Without --advertise nothing else puts that host in the certificate.
func TestCertNamesEtcdHTTPHost(t *testing.T) {
	n := &Node{cfg: Config{API: ":8443", S3: "127.0.0.1:9000", NBD: "127.0.0.1:10809",
		EtcdClient: "127.0.0.1:2379", EtcdPeer: "127.0.0.1:2380", EtcdHTTP: "198.51.100.9:2381"}}
	if names := n.certNames(); !slices.Contains(names, "198.51.100.9") {
		t.Fatalf("certificate names %v lack the --etcd-http host 198.51.100.9", names)
	}
}
