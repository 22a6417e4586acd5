package meta

import (
	"log/slog"
	"os"
	"strconv"
	"strings"
)

// Peer connections after a partition. etcd's members talk over long-lived
// TCP streams, and etcd means their readers to time out after 5 s of
// silence and redial — but it sets that timeout through an http.Transport
// Dial hook that net/http ignores once DialContext is set, which etcd also
// sets (go.etcd.io/etcd/client/pkg/v3/transport, NewTimeoutTransport, up to
// v3.7.3 at least). So a stream cut by a partition is never redialled: what
// its writer queued during the cut arrives when TCP retransmits it, and
// TCP's retransmissions back off exponentially — after a heal, up to about
// the partition's length later, and up to net.ipv4.tcp_rto_max_ms (2 min by
// default) after a long one. Until then the healed member is no use to the
// quorum: a voter lost in that window pauses writes (13-14 s after a 14 s
// cut here; tests/e2e/heal_test.go). Linux 6.15 made the backoff's cap a
// setting; at 1 s the streams carry messages again within a second of the
// heal. basalt cannot set it on etcd's sockets, so it says so at start.

// rtoMaxPath is the kernel's cap on a TCP retransmission timeout, in ms
// (Linux 6.15 and later; per network namespace).
const rtoMaxPath = "/proc/sys/net/ipv4/tcp_rto_max_ms"

// rtoMaxAdvised is the cap docs/cluster.md advises for metadata members:
// the election timeout's order, so a healed member is back within one.
const rtoMaxAdvised = 1000

// checkPeerRetransmit warns when path says TCP's retransmissions may back
// off far beyond rtoMaxAdvised. Kernels without the setting are not warned
// about: nothing can be done there but wait.
func checkPeerRetransmit(log *slog.Logger, path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || v <= rtoMaxAdvised {
		return
	}
	log.Warn("after a network partition heals, this metadata member may stay unreachable for up to net.ipv4.tcp_rto_max_ms; set it to 1000 (docs/cluster.md)",
		"tcp_rto_max_ms", v, "advised", rtoMaxAdvised)
}
