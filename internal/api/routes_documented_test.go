package api

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"log/slog"
	"maps"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/cluster"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/objects"
	"github.com/basalt-storage/basalt/internal/volume"
)

// serverPatterns are the "METHOD /path" patterns New registers, read from
// server.go (the mux cannot list them).
func serverPatterns(t *testing.T) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "server.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) == 0 {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		lit, isLit := call.Args[0].(*ast.BasicLit)
		if !ok || !isLit || lit.Kind != token.STRING || (sel.Sel.Name != "route" && sel.Sel.Name != "HandleFunc") {
			return true
		}
		p, _ := strconv.Unquote(lit.Value)
		if p != "/" { // noRoute
			out = append(out, p)
		}
		return true
	})
	if len(out) < 10 {
		t.Fatalf("found only %d routes in server.go: %v", len(out), out)
	}
	return out
}

// openapiDocument is what these tests read of openapi.json.
type openapiDocument struct {
	Info struct {
		Description string `json:"description"`
	} `json:"info"`
	Paths map[string]map[string]json.RawMessage `json:"paths"`
}

type openapiOperation struct {
	Responses  map[string]json.RawMessage `json:"responses"`
	ErrorCodes []string                   `json:"x-error-codes"`
}

func readOpenAPI(t *testing.T) openapiDocument {
	t.Helper()
	var doc openapiDocument
	if err := json.Unmarshal(openapiDoc, &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

// operations are openapi.json's operations by "METHOD /path".
func (doc openapiDocument) operations(t *testing.T) map[string]openapiOperation {
	t.Helper()
	ops := map[string]openapiOperation{}
	for p, item := range doc.Paths {
		for m, raw := range item {
			if m == "parameters" {
				continue
			}
			var op openapiOperation
			if err := json.Unmarshal(raw, &op); err != nil {
				t.Fatalf("%s %s: %v", m, p, err)
			}
			ops[strings.ToUpper(m)+" "+p] = op
		}
	}
	return ops
}

// docRoutes are the "METHOD /path" of docs/api.md's endpoint headings
// ("#### `POST /v1/volumes/{id}/flatten`, `/repair`, `/scrub`: ..." is
// three).
func docRoutes(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	tick := regexp.MustCompile("`([^`]+)`")
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "#### `") {
			continue
		}
		head, _, _ := strings.Cut(line, ":")
		var method, last string
		for _, m := range tick.FindAllStringSubmatch(head, -1) {
			s, _, _ := strings.Cut(m[1], "?")
			if mm, p, ok := strings.Cut(s, " "); ok {
				method, last = mm, p
			} else if method != "" && strings.HasPrefix(s, "/") {
				// A sibling: /repair after /v1/volumes/{id}/flatten.
				last = last[:strings.LastIndex(last, "/")] + s
			}
			out = append(out, method+" "+last)
		}
	}
	return out
}

// TestRoutesDocumented: the routes of the server, the operations of
// openapi.json and the endpoints of docs/api.md are the same, and every
// documented operation is routed: it is answered by its own handler, not
// with 404 or 405.
func TestRoutesDocumented(t *testing.T) {
	server := serverPatterns(t)
	doc := readOpenAPI(t)
	ops := slices.Sorted(maps.Keys(doc.operations(t)))
	guide := docRoutes(t)
	for _, p := range server {
		if !slices.Contains(ops, p) {
			t.Errorf("route %s is not in openapi.json", p)
		}
		if !slices.Contains(guide, p) {
			t.Errorf("route %s is not in docs/api.md", p)
		}
	}
	for _, p := range ops {
		if !slices.Contains(server, p) {
			t.Errorf("openapi.json documents %s, which the server does not route", p)
		}
	}
	for _, p := range guide {
		if !slices.Contains(server, p) {
			t.Errorf("docs/api.md documents %s, which the server does not route", p)
		}
	}
	// Each operation, as a client would send it: routed to its handler
	// (authentication answers, or a public handler), with HEAD where GET
	// is. The server is not ready, so /healthz answers 503 without asking
	// a health check.
	s := New(Deps{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	params := regexp.MustCompile(`\{[^}]+\}`)
	for _, op := range ops {
		method, p, _ := strings.Cut(op, " ")
		target := params.ReplaceAllString(p, "x")
		methods := []string{method}
		if method == "GET" {
			methods = append(methods, "HEAD")
		}
		for _, m := range methods {
			r := httptest.NewRequest(m, target, nil)
			if _, pattern := s.mux.Handler(r); pattern != op {
				t.Errorf("%s %s is routed to %q, not to %s", m, target, pattern, op)
			}
			w := httptest.NewRecorder()
			s.ServeHTTP(w, r)
			if w.Code == 404 || w.Code == 405 {
				t.Errorf("%s %s (%s): HTTP %d %s", m, target, op, w.Code, w.Body)
			}
		}
	}
}

// errorTable is the code → HTTP status table of a Markdown text.
func errorTable(text string) map[string]int {
	out := map[string]int{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(\\w+)` \\| (\\d{3}) \\|").FindAllStringSubmatch(text, -1) {
		out[m[1]], _ = strconv.Atoi(m[2])
	}
	return out
}

// errsCodes are the codes package errs defines, read from its source.
func errsCodes(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../errs/errs.go")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range regexp.MustCompile(`(?m)^\s+Code\w+\s+= "(\w+)"`).FindAllStringSubmatch(string(b), -1) {
		out = append(out, m[1])
	}
	if len(out) < 20 {
		t.Fatalf("found only %d codes in errs.go", len(out))
	}
	return out
}

// TestErrorCodesDocumented: every code the API answers — those of
// package errs, of the object, cluster and volume packages it passes
// on, and every code an operation of openapi.json lists — is in the
// error table of docs/api.md and in that of openapi.json (the list its
// ErrorDetail.code points to), with the same HTTP status. Each
// operation's x-error-codes holds the codes its responses describe, and
// each of those codes' status is among its responses.
func TestErrorCodesDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	guide := errorTable(string(b))
	doc := readOpenAPI(t)
	spec := errorTable(doc.Info.Description)
	ops := doc.operations(t)

	codes := errsCodes(t)
	codes = append(codes, CodeAccessDenied, CodeObjectStoreUnavailable, volume.CodeBucketReplaced,
		objects.CodeNoSuchBucket, objects.CodeInvalidBucketName, objects.CodeInvalidKey, objects.CodeNoSuchFile,
		objects.CodeNotARegularFile, objects.CodeNotExported, objects.CodeFileChanged, objects.CodeFileAccess,
		objects.CodeMetadataTooLarge, objects.CodeHardLinked,
		cluster.CodeNodeExists, cluster.CodeJoinTokenBad, cluster.CodeExternalMeta, cluster.CodeNodeIsSelf,
		cluster.CodeLastVoter, cluster.CodeWouldLoseQuorum, meta.CodeJoinInProgress)
	for _, op := range ops {
		codes = append(codes, op.ErrorCodes...)
	}
	slices.Sort(codes)
	for _, c := range slices.Compact(codes) {
		if _, ok := guide[c]; !ok {
			t.Errorf("code %s is not in the error table of docs/api.md", c)
		}
		if _, ok := spec[c]; !ok {
			t.Errorf("code %s is not in the error table of openapi.json's info", c)
		}
		if guide[c] != spec[c] && guide[c] != 0 && spec[c] != 0 {
			t.Errorf("code %s: HTTP %d in docs/api.md, %d in openapi.json", c, guide[c], spec[c])
		}
	}

	listed := regexp.MustCompile("- `(\\w+)`")
	for name, op := range ops {
		for status, raw := range op.Responses {
			var r struct {
				Description string `json:"description"`
				Content     map[string]struct {
					Examples map[string]struct {
						Value ErrorBody `json:"value"`
					} `json:"examples"`
				} `json:"content"`
			}
			json.Unmarshal(raw, &r)
			var described []string
			for _, m := range listed.FindAllStringSubmatch(r.Description, -1) {
				described = append(described, m[1])
			}
			for _, c := range r.Content {
				for _, ex := range c.Examples {
					if ex.Value.Error.Code != "" {
						described = append(described, ex.Value.Error.Code)
					}
				}
			}
			slices.Sort(described)
			for _, c := range slices.Compact(described) {
				if !slices.Contains(op.ErrorCodes, c) {
					t.Errorf("%s: its %s response has code %s, which is not among its x-error-codes %v", name, status, c, op.ErrorCodes)
				}
			}
		}
		for _, c := range op.ErrorCodes {
			if st, ok := guide[c]; ok {
				if _, ok := op.Responses[strconv.Itoa(st)]; !ok {
					t.Errorf("%s lists %s (HTTP %d) but declares no %d response", name, c, st, st)
				}
			}
		}
	}
}
