package api

import (
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/basalt-storage/basalt/internal/errs"
)

// An answer that does not encode (a NaN) is a 500 with the API's error
// body, not a 200 with none.
func TestWriteJSONEncodesFirst(t *testing.T) {
	rec := httptest.NewRecorder()
	writeJSON(rec, http.StatusOK, map[string]float64{"overcommit": math.NaN()})
	var body ErrorBody
	if rec.Code != http.StatusInternalServerError || json.Unmarshal(rec.Body.Bytes(), &body) != nil || body.Error.Code != errs.CodeInternal {
		t.Fatalf("HTTP %d %q", rec.Code, rec.Body.String())
	}
	rec = httptest.NewRecorder()
	writeJSON(rec, http.StatusCreated, map[string]int{"n": 1})
	if rec.Code != http.StatusCreated || rec.Body.String() != "{\n  \"n\": 1\n}\n" {
		t.Fatalf("HTTP %d %q", rec.Code, rec.Body.String())
	}
}
