package api

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestEndpointErrorsInOpenAPI: every error code docs/api.md names in an
// endpoint's "Errors:" list is among the x-error-codes of that operation
// in openapi.json, so that a client generated from it knows the error.
// DELETE /v1/snapshots/{id} is documented to answer VolumeBusy (a clone
// of the snapshot held its lock for more than 10 s) but openapi.json
// listed no VolumeBusy and described that case as SnapshotInUse, which
// the server answers only for a running export.
func TestEndpointErrorsInOpenAPI(t *testing.T) {
	b, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	guide := errorTable(string(b))
	ops := readOpenAPI(t).operations(t)
	tick := regexp.MustCompile("`(\\w+)`")
	// Each endpoint section: its routes (docRoutes of its heading) and
	// its text up to the next heading.
	sections := strings.Split(string(b), "\n#### ")
	checked := 0
	for _, sec := range sections[1:] {
		head, body, _ := strings.Cut(sec, "\n")
		if end := strings.Index(body, "\n#"); end >= 0 {
			body = body[:end]
		}
		routes := docRoutesOf(t, "#### "+head)
		_, errText, ok := strings.Cut(body, "Errors:")
		if !ok {
			continue
		}
		// The list ends with its paragraph.
		errText, _, _ = strings.Cut(errText, "\n\n")
		for _, m := range tick.FindAllStringSubmatch(errText, -1) {
			code := m[1]
			if _, isCode := guide[code]; !isCode {
				continue
			}
			for _, r := range routes {
				op, ok := ops[r]
				if !ok {
					continue // TestRoutesDocumented reports it
				}
				checked++
				if !slices.Contains(op.ErrorCodes, code) {
					t.Errorf("docs/api.md lists %s for %s; openapi.json's x-error-codes do not: %v", code, r, op.ErrorCodes)
				}
			}
		}
	}
	if checked < 50 {
		t.Fatalf("checked only %d documented errors", checked)
	}
}

// docRoutesOf is docRoutes of one heading line.
func docRoutesOf(t *testing.T, heading string) []string {
	t.Helper()
	var out []string
	tick := regexp.MustCompile("`([^`]+)`")
	head, _, _ := strings.Cut(heading, ":")
	var method, last string
	for _, m := range tick.FindAllStringSubmatch(head, -1) {
		s, _, _ := strings.Cut(m[1], "?")
		if mm, p, ok := strings.Cut(s, " "); ok {
			method, last = mm, p
		} else if method != "" && strings.HasPrefix(s, "/") {
			last = last[:strings.LastIndex(last, "/")] + s
		}
		out = append(out, method+" "+last)
	}
	return out
}
