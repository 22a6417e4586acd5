package cluster

// The joining side: a new node asks a running one to let it in.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/pki"
)

// EnterParams say how to join: through which node, authenticated how.
type EnterParams struct {
	// Via is a running node's API, https://HOST:PORT.
	Via string
	// Exactly one of: an admin identity directory, or a join token.
	Identity string
	Token    string
	Request  JoinRequest
}

// joinRetryFor bounds how long Enter waits for another node's join.
const joinRetryFor = 3 * time.Minute

// CheckJoinURL says whether via can name a node's API for a join:
// https://HOST:PORT (a trailing slash allowed), nothing else. The CLI
// checks it before a server touches its data directory.
func CheckJoinURL(via string) error {
	u, err := url.Parse(strings.TrimRight(via, "/"))
	if err != nil || u.Scheme != "https" || u.Hostname() == "" || u.Path != "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return fmt.Errorf("--join %q: an https://HOST:PORT URL of a node's API is required", via)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("--join %q: port %q is no TCP port", via, p)
		}
	}
	return nil
}

// Enter asks p.Via to let this node in and returns the answer. A join in
// progress elsewhere (409 JoinInProgress) is waited out.
func Enter(ctx context.Context, p EnterParams) (*JoinResponse, error) {
	if (p.Identity == "") == (p.Token == "") {
		return nil, errs.Invalid(errs.CodeInvalidRequest, "--join needs exactly one of --identity (an admin identity) or --join-token")
	}
	if err := CheckJoinURL(p.Via); err != nil {
		return nil, errs.Invalid(errs.CodeInvalidRequest, "%v", err)
	}
	base := strings.TrimRight(p.Via, "/")
	var tlsCfg *tls.Config
	var auth string
	if p.Identity != "" {
		id, err := pki.LoadIdentity(p.Identity)
		if err != nil {
			return nil, fmt.Errorf("join identity: %w", err)
		}
		if tlsCfg, err = id.ClientTLS(); err != nil {
			return nil, fmt.Errorf("join identity: %w", err)
		}
	} else {
		_, hash, err := ParseJoinToken(p.Token)
		if err != nil {
			return nil, err
		}
		pool, err := discoverCA(ctx, base, hash)
		if err != nil {
			return nil, err
		}
		tlsCfg = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		auth = "Bearer " + p.Token
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg}, Timeout: time.Minute}
	body, _ := json.Marshal(p.Request)
	deadline := time.Now().Add(joinRetryFor)
	for {
		resp, err := post(ctx, hc, base+"/v1/nodes/join", auth, body)
		if err == nil {
			return resp, nil
		}
		if !errs.IsCode(err, CodeJoinInProgress) || time.Now().After(deadline) {
			return nil, fmt.Errorf("join via %s: %w", p.Via, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func post(ctx context.Context, hc *http.Client, url, auth string, body []byte) (*JoinResponse, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if json.Unmarshal(b, &e) == nil && e.Error.Code != "" {
			return nil, errs.New(errs.KindForStatus(resp.StatusCode), e.Error.Code, "%s", e.Error.Message)
		}
		return nil, fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(b))
	}
	var out JoinResponse
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("join answer: %w", err)
	}
	return &out, nil
}

// discoverCA fetches the cluster CA from base without trusting the
// connection, and accepts it only if it hashes to want (from the token):
// from then on the connection to the cluster is authenticated.
func discoverCA(ctx context.Context, base, want string) (*x509.CertPool, error) {
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}, //nolint:gosec // checked by hash below
	}}
	req, err := http.NewRequestWithContext(ctx, "GET", base+"/v1/cluster/ca", nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch the cluster CA from %s: %w", base, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil || resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetch the cluster CA from %s: %s %v", base, resp.Status, err)
	}
	if got := CAHash(b); got != want {
		return nil, errs.New(errs.KindUnauthenticated, CodeJoinTokenBad,
			"%s presents CA %s, not the one the join token names (%s): not the cluster the token is for", base, got, want)
	}
	// Trust the certificate the hash is of, and nothing else the answer
	// holds: CAHash is of the first certificate, and any CA appended
	// after it (the real CA is public) would otherwise be trusted too —
	// its holder could take the join, and the token with it.
	ca, err := pki.ParseCertPEM(b)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return pool, nil
}
