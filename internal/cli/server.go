package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/basalt-storage/basalt/internal/cluster"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/nbd"
	"github.com/basalt-storage/basalt/internal/objects"
	"github.com/basalt-storage/basalt/internal/server"
	"github.com/basalt-storage/basalt/internal/size"
	"github.com/basalt-storage/basalt/internal/volume"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"
)

func serverCmd(g *globals) *cobra.Command {
	var cfg server.Config
	var configFile, logLevel, metaQuota, nbdInFlight string
	var endpoints []string
	cmd := &cobra.Command{
		Use:   "server",
		Short: "run a basalt node",
		Long: `Run a basalt node: control API, metadata (embedded etcd unless
--meta-endpoints is given) and the volume service.

Every flag can also be set with the environment variable BASALT_<FLAG>
(e.g. BASALT_DATA) or in the YAML file given by --config; a flag on the
command line wins over the environment, which wins over the file. A setting
given empty (BASALT_S3_TLS=, or "s3-tls:" in the file) is its default.`,
		Args:        noArgs,
		Annotations: map[string]string{envAnnotation: envEveryFlag},
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyConfigFile(cmd.Flags(), configFile); err != nil {
				return err
			}
			var err error
			if cfg.ImageGrace < 0 {
				return usageErr("--image-grace must not be negative")
			}
			if metaQuota != "" {
				if cfg.MetaQuota, err = size.Parse(metaQuota); err != nil {
					return usageErr("--meta-quota: %v", err)
				}
			}
			if nbdInFlight != "" {
				if cfg.NBDMaxInFlight, err = size.Parse(nbdInFlight); err != nil || cfg.NBDMaxInFlight <= 0 {
					return usageErr("--nbd-max-inflight: want a size greater than 0 (e.g. 512MiB), got %q", nbdInFlight)
				}
			}
			if cfg.NBDMaxHandshakes <= 0 {
				return usageErr("--nbd-max-handshakes: want a number greater than 0, got %d", cfg.NBDMaxHandshakes)
			}
			if !(cfg.Overcommit > 0 && cfg.Overcommit <= volume.MaxOvercommit) { // NaN fails too
				return usageErr("--overcommit must be a number greater than 0 and at most %g, not %v", volume.MaxOvercommit, cfg.Overcommit)
			}
			if cfg.Voters != 1 && cfg.Voters != 3 && cfg.Voters != 5 {
				return usageErr("--voters must be 1, 3 or 5 (an even number of voters tolerates no more failures than one less)")
			}
			if cfg.Join != "" {
				if err := cluster.CheckJoinURL(cfg.Join); err != nil {
					return usageErr("%v", err)
				}
				if cfg.JoinToken == "" {
					cfg.JoinIdentity = g.identity
				}
				if (cfg.JoinIdentity == "") == (cfg.JoinToken == "") {
					return usageErr("--join needs exactly one of --identity DIR (an admin identity) or --join-token TOKEN")
				}
			} else if cfg.JoinToken != "" {
				// Not ignored: the node would start a cluster of its own
				// where a join was meant.
				return usageErr("--join-token needs --join URL (the API of a node of the cluster to join)")
			}
			for _, e := range endpoints {
				for _, p := range strings.Split(e, ",") {
					if p = strings.TrimSpace(p); p != "" {
						cfg.MetaEndpoints = append(cfg.MetaEndpoints, p)
					}
				}
			}
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return usageErr("--log-level: %v", err)
			}
			log := slog.New(slog.NewTextHandler(g.stderr, &slog.HandlerOptions{Level: level}))
			return runServer(cfg, log, g)
		},
	}
	f := cmd.Flags()
	f.StringVar(&configFile, "config", "", "YAML file of flag values (keys are flag names)")
	f.StringVar(&cfg.Data, "data", "./basalt-data", "data directory: meta/, pki/, identities/, store/")
	f.StringVar(&cfg.Store, "store", "", "data root on the shared file system (default DATA/store)")
	f.StringVar(&cfg.API, "api", ":8443", "control API listen address (HTTPS, mTLS)")
	f.StringVar(&cfg.S3, "s3", ":9000", "S3 listen address (SigV4); beyond loopback it serves HTTPS (cluster CA certificate) unless --s3-insecure")
	f.BoolVar(&cfg.S3TLS, "s3-tls", false, "serve S3 over HTTPS on a loopback --s3 address too")
	f.BoolVar(&cfg.S3Insecure, "s3-insecure", false, "allow S3 over plain HTTP on a non-loopback --s3 address")
	f.StringVar(&cfg.S3Cert, "s3-cert", "", "PEM certificate (chain) for S3 instead of one from the cluster CA, e.g. from a public CA; implies HTTPS, needs --s3-key")
	f.StringVar(&cfg.S3Key, "s3-key", "", "PEM private key of --s3-cert")
	f.StringVar(&cfg.S3TrustFile, "s3-trust-file", objects.DefaultTrustFile, "where a uid vouches for the S3 user mapped to it ({home}: its home directory, {uid}: its number); see docs/objects.md")
	f.StringVar(&cfg.NBD, "nbd", "127.0.0.1:10809", "NBD listen address; beyond loopback, clients must use TLS (nbds://) unless --nbd-insecure")
	f.BoolVar(&cfg.NBDInsecure, "nbd-insecure", false, "allow NBD without TLS on a non-loopback --nbd address")
	f.IntVar(&cfg.NBDMaxHandshakes, "nbd-max-handshakes", nbd.DefaultMaxHandshakes, "NBD connections in the handshake at once (before their export name, unauthenticated); more wait a moment, then are closed")
	f.StringVar(&nbdInFlight, "nbd-max-inflight", "", "NBD payload in flight across all connections, a size (default 256MiB); readers wait their turn beyond it")
	f.StringVar(&cfg.EtcdClient, "etcd-client", "127.0.0.1:2379", "embedded etcd client listen address")
	f.StringVar(&cfg.EtcdPeer, "etcd-peer", "127.0.0.1:2380", "embedded etcd peer listen address")
	f.StringVar(&cfg.EtcdHTTP, "etcd-http", "", "embedded etcd's /metrics and /health listen address, TLS like --etcd-client (default: a free loopback port, logged at start)")
	f.StringVar(&cfg.Metrics, "metrics", "", "Prometheus /metrics listen address, plain HTTP, e.g. 127.0.0.1:9464 (default: none; nothing is counted)")
	f.StringVar(&cfg.Name, "name", "", "node name (default: host name)")
	f.StringVar(&cfg.Advertise, "advertise", "", "host name other nodes and clients use for this node")
	f.StringSliceVar(&endpoints, "meta-endpoints", nil, "use this external etcd cluster (comma-separated URLs) instead of the embedded member")
	f.Float64Var(&cfg.Overcommit, "overcommit", volume.DefaultOvercommit, "thin provisioning limit: provisioned bytes <= store capacity × this")
	f.DurationVar(&cfg.ImageGrace, "image-grace", volume.DefaultImageGrace, "spare unreferenced copy-on-write images younger than this from collection (other nodes may be creating them)")
	f.StringVar(&metaQuota, "meta-quota", "", "embedded etcd space quota (default 4GiB)")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&cfg.Join, "join", "", "join the cluster of this node (its API URL, https://HOST:8443), authenticated by --identity (an admin identity) or --join-token; see docs/cluster.md")
	f.StringVar(&cfg.JoinToken, "join-token", "", "a `token` from basalt node join-token, for --join")
	f.IntVar(&cfg.Voters, "voters", 3, "voting metadata members a new cluster grows to as nodes join (1, 3 or 5; later nodes are etcd clients)")
	return cmd
}

// applyConfigFile sets flags still at their defaults (not given as a flag
// or through the environment) from a YAML map of flag name to value.
func applyConfigFile(fs *pflag.FlagSet, path string) error {
	if path == "" {
		return nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return usageErr("--config: %v", err)
	}
	// Numbers are kept as written (json.Number): decoded as float64, a
	// size in bytes such as 1073741824 would print as 1.073741824e+09,
	// which no flag parses — a value must mean here what it means as a
	// flag or in the environment.
	// Strict: a key given twice is refused, not settled silently by
	// whichever came last.
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return usageErr("--config %s: %v", path, err)
	}
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		return usageErr("--config %s: %v", path, err)
	}
	for k, v := range m {
		f := fs.Lookup(k)
		// config names the file itself; endpoint and output are the
		// client commands' globals, meaningless to a server (and a value
		// set here would skip the checks they get as flags); help is no
		// setting (read here, after the command line, it did nothing).
		if f == nil || k == "config" || k == "endpoint" || k == "output" || k == "help" {
			return usageErr("--config %s: unknown setting %q", path, k)
		}
		if f.Changed || v == nil || v == "" {
			continue // a key left empty ("advertise:", `api: ""`) sets nothing: the default
		}
		if _, ok := v.(map[string]any); ok {
			return usageErr("--config %s: %s: a mapping is no value of a flag", path, k)
		}
		val := fmt.Sprint(v)
		if list, ok := v.([]any); ok {
			parts := make([]string, len(list))
			for i, x := range list {
				parts[i] = fmt.Sprint(x)
			}
			val = strings.Join(parts, ",")
		}
		if err := f.Value.Set(val); err != nil {
			return usageErr("--config %s: %s: %v", path, k, err)
		}
	}
	return nil
}

func runServer(cfg server.Config, log *slog.Logger, g *globals) error {
	tuneGC(log)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	n, err := server.Start(ctx, cfg, log)
	if err != nil {
		if _, ok := errs.As(err); ok {
			return err
		}
		return errs.New(errs.KindInternal, "ServerError", "server: %v", err)
	}
	ep := localEndpoint(n.APIAddr())
	try := "BASALT_IDENTITY=" + n.AdminDir
	if ep != defaultEndpoint {
		try = "BASALT_ENDPOINT=" + ep + " " + try
	}
	fmt.Fprintf(g.stderr, `
basalt node %q is ready: %s
Admin identity: %s
Try:  %s basalt status
`, n.Name(), ep, n.AdminDir, try)
	select {
	case <-ctx.Done():
		// A second SIGTERM or SIGINT ends the process at once (the
		// default action, restored here): a shutdown stuck on a store
		// that does not answer can be cut short, as by SIGKILL — what
		// was flushed is safe.
		stop()
		log.Info("shutting down", "force", "signal again to stop at once")
	case <-n.Done():
		log.Info("shutting down")
	}
	n.Close()
	log.Info("stopped")
	if err := n.Err(); err != nil {
		return errs.New(errs.KindInternal, "ServerError", "server: %v", err)
	}
	return nil
}

// localEndpoint is the URL of the API listening on addr for a client on
// this machine. An address without a host (--api :8443, the default)
// listens on all of them, but "https://[::]:8443" is no URL to use: the
// node's certificate does not name "::". Loopback it names, and reaches.
func localEndpoint(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "https://" + addr
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "https://" + net.JoinHostPort(host, port)
}

func version() string { return server.Version }
