package server

import (
	"slices"
	"testing"
)

// The node certificate names every host the node listens on: an nbds://
// URI names the --nbd host, which clients verify the certificate against
// (without --advertise, nothing else puts it there).
func TestCertNamesListenHosts(t *testing.T) {
	n := &Node{cfg: Config{API: ":8443", S3: "198.51.100.3:9000", NBD: "192.0.2.2:10809",
		EtcdClient: "0.0.0.0:2379", EtcdPeer: "[2001:db8::7]:2380"}}
	names := n.certNames()
	for _, want := range []string{"localhost", "198.51.100.3", "192.0.2.2", "2001:db8::7"} {
		if !slices.Contains(names, want) {
			t.Errorf("certificate names %v lack %s", names, want)
		}
	}
	for _, not := range []string{"", "0.0.0.0", "::"} {
		if slices.Contains(names, not) {
			t.Errorf("certificate names %v hold the wildcard %q", names, not)
		}
	}
}
