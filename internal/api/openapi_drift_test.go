package api

// Drift between the server and its two descriptions, openapi.json and
// docs/api.md, beyond the route list (routes_documented_test.go): the
// fields and JSON types of every schema against the Go wire types, the
// success statuses each handler can answer, the query and path
// parameters each route takes, and every error code the source can
// answer — found in the source, not in a hand-kept list, so that a code
// added to a package behind the API fails here until it is documented.

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/cluster"
	"github.com/basalt-storage/basalt/internal/volume"
)

// openapiRaw is openapi.json as generic JSON.
func openapiRaw(t *testing.T) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(openapiDoc, &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

// wireSchemas are the Go types behind openapi.json's schemas. Schemas
// reached from these through $ref are checked against the field's type
// too; every schema must be reached (or be in schemaNoGoType).
var wireSchemas = map[string]reflect.Type{
	"ErrorBody":               reflect.TypeFor[ErrorBody](),
	"CreateUserRequest":       reflect.TypeFor[CreateUserRequest](),
	"CreateUserResponse":      reflect.TypeFor[CreateUserResponse](),
	"CredentialsResponse":     reflect.TypeFor[CredentialsResponse](),
	"CreateVolumeRequest":     reflect.TypeFor[CreateVolumeRequest](),
	"ExtendVolumeRequest":     reflect.TypeFor[ExtendVolumeRequest](),
	"CreateSnapshotRequest":   reflect.TypeFor[CreateSnapshotRequest](),
	"ExportSnapshotRequest":   reflect.TypeFor[ExportSnapshotRequest](),
	"CreateVolumeTypeRequest": reflect.TypeFor[CreateVolumeTypeRequest](),
	"AttachRequest":           reflect.TypeFor[AttachRequest](),
	"Volume":                  reflect.TypeFor[Volume](),
	"Snapshot":                reflect.TypeFor[Snapshot](),
	"VolumeType":              reflect.TypeFor[VolumeType](),
	"Status":                  reflect.TypeFor[Status](),
	"ObjectsRoot":             reflect.TypeFor[ObjectsRoot](),
	"ObjectPath":              reflect.TypeFor[ObjectPath](),
	"ObjectsRequest":          reflect.TypeFor[ObjectsRequest](),
	"ObjectResult":            reflect.TypeFor[ObjectResult](),
	"VerifyResult":            reflect.TypeFor[VerifyResult](),
	"JoinTokenRequest":        reflect.TypeFor[JoinTokenRequest](),
	"JoinToken":               reflect.TypeFor[JoinToken](),
	"RevokeJoinTokenRequest":  reflect.TypeFor[RevokeJoinTokenRequest](),
	"Node":                    reflect.TypeFor[cluster.NodeInfo](),
	"JoinRequest":             reflect.TypeFor[cluster.JoinRequest](),
	"JoinResponse":            reflect.TypeFor[cluster.JoinResponse](),
	// The stack of a volume type is a json.RawMessage the volume service
	// reads as a block.Spec.
	"LayerSpec": reflect.TypeFor[block.Spec](),
	// A JobResult's report is an any: these are what the jobs record.
	"ScrubReport":  reflect.TypeFor[block.ScrubReport](),
	"RepairReport": reflect.TypeFor[block.RepairReport](),
	"CopyReport":   reflect.TypeFor[volume.ExportReport](),
}

// notRequired are fields a schema's Go type always has that are not
// required all the same: the schema stands for another type too.
var notRequired = map[string]string{
	"CopyReport.size_bytes": "an import's report (volume.ImportReport) has no size_bytes",
}

// schemaNoGoType are schemas with no Go struct behind them.
var schemaNoGoType = map[string]string{
	"Size":         "Size: a number or a size string (Size.UnmarshalJSON)",
	"Health":       `healthz answers map[string]string{"status": "ok"}`,
	"DefragResult": `defrag answers map[string]string{"status": "defragmented"}`,
}

// wireFields are t's JSON fields (embedded structs flattened) by name,
// with whether they are omitempty.
func wireFields(t reflect.Type) map[string]reflect.StructField {
	out := map[string]reflect.StructField{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" || !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			maps.Copy(out, wireFields(f.Type))
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f
	}
	return out
}

type schemaChecker struct {
	t       *testing.T
	schemas map[string]any
	seen    map[string]reflect.Type
}

// resolve follows s's $ref, returning the schema and its name ("" if
// inline).
func (c *schemaChecker) resolve(s map[string]any) (map[string]any, string) {
	ref, ok := s["$ref"].(string)
	if !ok {
		return s, ""
	}
	name := strings.TrimPrefix(ref, "#/components/schemas/")
	target, ok := c.schemas[name].(map[string]any)
	if !ok {
		c.t.Errorf("$ref %s names no schema", ref)
		return map[string]any{}, name
	}
	return target, name
}

// schemaTypes is the JSON type(s) s declares.
func schemaTypes(s map[string]any) []string {
	switch ty := s["type"].(type) {
	case string:
		return []string{ty}
	case []any:
		var out []string
		for _, x := range ty {
			out = append(out, x.(string))
		}
		return out
	}
	return nil
}

var (
	timeType = reflect.TypeFor[time.Time]()
	rawType  = reflect.TypeFor[json.RawMessage]()
	sizeType = reflect.TypeFor[Size]()
)

// check reports where schema s (at where) differs from Go type gt.
func (c *schemaChecker) check(where string, s map[string]any, gt reflect.Type) {
	for gt.Kind() == reflect.Pointer {
		gt = gt.Elem()
	}
	if gt == rawType || gt.Kind() == reflect.Interface {
		return // any JSON: described by its own schema (wireSchemas) or a oneOf
	}
	s, name := c.resolve(s)
	if name != "" {
		if prev, ok := c.seen[name]; ok {
			if prev != gt {
				c.t.Errorf("%s: schema %s stands for %v here and for %v elsewhere", where, name, gt, prev)
			}
			return
		}
		c.seen[name] = gt
		where = name
	}
	ty := schemaTypes(s)
	want := func(js ...string) {
		for _, j := range js {
			if slices.Contains(ty, j) {
				return
			}
		}
		c.t.Errorf("%s: type %v in openapi.json; the server's %v is %s in JSON", where, ty, gt, strings.Join(js, " or "))
	}
	switch {
	case gt == sizeType:
		if name != "Size" {
			c.t.Errorf("%s: a Size (number or size string) is not described by the Size schema", where)
		}
		return
	case gt == timeType:
		want("string")
		if s["format"] != "date-time" {
			c.t.Errorf("%s: a time has no format date-time", where)
		}
		return
	}
	switch gt.Kind() {
	case reflect.String:
		want("string")
	case reflect.Bool:
		want("boolean")
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		want("integer")
	case reflect.Float32, reflect.Float64:
		want("number")
	case reflect.Slice, reflect.Array:
		want("array")
		if items, ok := s["items"].(map[string]any); ok {
			c.check(where+"[]", items, gt.Elem())
		} else {
			c.t.Errorf("%s: an array without items", where)
		}
	case reflect.Map:
		want("object")
	case reflect.Struct:
		want("object")
		c.checkStruct(where, s, gt)
	default:
		c.t.Errorf("%s: Go type %v not handled by this test", where, gt)
	}
}

// checkStruct compares a struct's JSON fields with an object schema's
// properties, both ways, and — for an answer (a schema that does not
// refuse unknown properties, as request schemas do) — that the fields
// always present (not omitempty) are the required ones.
func (c *schemaChecker) checkStruct(where string, s map[string]any, gt reflect.Type) {
	props, _ := s["properties"].(map[string]any)
	fields := wireFields(gt)
	for _, n := range slices.Sorted(maps.Keys(fields)) {
		p, ok := props[n].(map[string]any)
		if !ok {
			c.t.Errorf("%s: field %q of %v is not among the schema's properties", where, n, gt)
			continue
		}
		c.check(where+"."+n, p, fields[n].Type)
	}
	for _, n := range slices.Sorted(maps.Keys(props)) {
		if _, ok := fields[n]; !ok {
			c.t.Errorf("%s: property %q is not a field of %v", where, n, gt)
		}
	}
	if s["additionalProperties"] == false {
		return // a request: required says what the server asks for
	}
	var required []string
	rs, _ := s["required"].([]any)
	for _, r := range rs {
		required = append(required, r.(string))
	}
	for n, f := range fields {
		omit := strings.Contains(f.Tag.Get("json"), ",omitempty")
		if why := notRequired[where+"."+n]; why != "" {
			if slices.Contains(required, n) {
				c.t.Errorf("%s: %q is required, but %s", where, n, why)
			}
			continue
		}
		if !omit && !slices.Contains(required, n) {
			c.t.Errorf("%s: %q is always in the answer (not omitempty) but not required", where, n)
		}
		if omit && slices.Contains(required, n) {
			c.t.Errorf("%s: %q is required but left out when empty (omitempty)", where, n)
		}
	}
}

// TestOpenAPISchemasMatchWireTypes: every schema of openapi.json has the
// fields, JSON types and (for answers) required fields of the Go type the
// server encodes or decodes.
func TestOpenAPISchemasMatchWireTypes(t *testing.T) {
	doc := openapiRaw(t)
	schemas := doc["components"].(map[string]any)["schemas"].(map[string]any)
	c := &schemaChecker{t: t, schemas: schemas, seen: map[string]reflect.Type{}}
	for _, name := range slices.Sorted(maps.Keys(wireSchemas)) {
		c.check(name, map[string]any{"$ref": "#/components/schemas/" + name}, wireSchemas[name])
	}
	// CopyReport stands for an import's report too: its fields are the
	// export's but size_bytes.
	imp := wireFields(reflect.TypeFor[volume.ImportReport]())
	exp := wireFields(reflect.TypeFor[volume.ExportReport]())
	for n := range exp {
		if _, ok := imp[n]; !ok && notRequired["CopyReport."+n] == "" {
			t.Errorf("CopyReport: %q of an export's report is not in an import's: say so (notRequired)", n)
		}
	}
	for n := range imp {
		if _, ok := exp[n]; !ok {
			t.Errorf("CopyReport: %q of an import's report is not in the schema", n)
		}
	}
	for name := range schemas {
		if _, ok := c.seen[name]; !ok && schemaNoGoType[name] == "" {
			t.Errorf("schema %s is not checked against a Go type: add it to wireSchemas", name)
		}
	}
}

// serverFuncs are the functions and methods of the package's non-test
// files, by name.
func serverFuncs(t *testing.T) map[string]*ast.FuncDecl {
	t.Helper()
	fset := token.NewFileSet()
	out := map[string]*ast.FuncDecl{}
	files, _ := filepath.Glob("*.go")
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok {
				key := fd.Name.Name
				if fd.Recv != nil {
					key = recvName(fd) + "." + key
				}
				out[key] = fd
			}
		}
	}
	return out
}

func recvName(fd *ast.FuncDecl) string {
	ty := fd.Recv.List[0].Type
	if st, ok := ty.(*ast.StarExpr); ok {
		ty = st.X
	}
	if id, ok := ty.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// routeCall is one s.route or s.mux.HandleFunc of New.
type routeCall struct {
	pattern string
	handler ast.Expr
	query   []ast.Expr
}

func routeCalls(t *testing.T, funcs map[string]*ast.FuncDecl) []routeCall {
	t.Helper()
	var out []routeCall
	ast.Inspect(funcs["New"], func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) < 2 {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		lit, isLit := call.Args[0].(*ast.BasicLit)
		if !ok || !isLit || (sel.Sel.Name != "route" && sel.Sel.Name != "HandleFunc") {
			return true
		}
		p, _ := strconv.Unquote(lit.Value)
		if p != "/" {
			out = append(out, routeCall{pattern: p, handler: call.Args[1], query: call.Args[2:]})
		}
		return true
	})
	if len(out) < 10 {
		t.Fatalf("found only %d routes in New", len(out))
	}
	return out
}

// successStatuses are the 2xx http.Status constants a handler (and the
// Server methods and package functions it calls) names; none is 200,
// as for a handler that only writes its body.
func successStatuses(funcs map[string]*ast.FuncDecl, handler ast.Expr) []int {
	codes := map[string]int{"StatusOK": 200, "StatusCreated": 201, "StatusAccepted": 202, "StatusNoContent": 204}
	var out []int
	seen := map[string]bool{}
	var walk func(n ast.Node)
	walk = func(n ast.Node) {
		ast.Inspect(n, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.SelectorExpr:
				if id, ok := x.X.(*ast.Ident); ok && id.Name == "http" {
					if c, ok := codes[x.Sel.Name]; ok && !slices.Contains(out, c) {
						out = append(out, c)
					}
				}
				if id, ok := x.X.(*ast.Ident); ok && id.Name == "s" {
					if fd := funcs["Server."+x.Sel.Name]; fd != nil && !seen[fd.Name.Name] {
						seen[fd.Name.Name] = true
						walk(fd.Body)
					}
				}
			case *ast.CallExpr:
				if id, ok := x.Fun.(*ast.Ident); ok {
					if fd := funcs[id.Name]; fd != nil && !seen[id.Name] {
						seen[id.Name] = true
						walk(fd.Body)
					}
				}
			}
			return true
		})
	}
	walk(handler)
	if len(out) == 0 {
		out = []int{200}
	}
	slices.Sort(out)
	return out
}

// TestOpenAPISuccessStatuses: the 2xx responses of each operation in
// openapi.json are the success statuses its handler answers.
func TestOpenAPISuccessStatuses(t *testing.T) {
	funcs := serverFuncs(t)
	ops := readOpenAPI(t).operations(t)
	for _, rc := range routeCalls(t, funcs) {
		op, ok := ops[rc.pattern]
		if !ok {
			continue // TestRoutesDocumented
		}
		var documented []int
		for st := range op.Responses {
			if n, _ := strconv.Atoi(st); n >= 200 && n < 300 {
				documented = append(documented, n)
			}
		}
		slices.Sort(documented)
		if got := successStatuses(funcs, rc.handler); !slices.Equal(got, documented) {
			t.Errorf("%s answers %v on success; openapi.json documents %v", rc.pattern, got, documented)
		}
	}
}

// queryNames evaluates the query arguments of a route call: string
// literals, pageParams, and append of those.
func queryNames(t *testing.T, args []ast.Expr) []string {
	var out []string
	var eval func(e ast.Expr)
	eval = func(e ast.Expr) {
		switch x := e.(type) {
		case *ast.BasicLit:
			s, _ := strconv.Unquote(x.Value)
			out = append(out, s)
		case *ast.Ident:
			if x.Name != "pageParams" {
				t.Fatalf("query argument %s not understood by this test", x.Name)
			}
			out = append(out, pageParams...)
		case *ast.CompositeLit:
			for _, el := range x.Elts {
				eval(el)
			}
		case *ast.CallExpr:
			if id, ok := x.Fun.(*ast.Ident); !ok || id.Name != "append" {
				t.Fatalf("query argument %T not understood by this test", x.Fun)
			}
			for _, a := range x.Args {
				eval(a)
			}
		default:
			t.Fatalf("query argument %T not understood by this test", e)
		}
	}
	for _, a := range args {
		eval(a)
	}
	slices.Sort(out)
	return out
}

// TestOpenAPIParameters: the query parameters of each operation in
// openapi.json are those its route takes (checkQuery), and its path
// parameters those of its pattern; docs/api.md names every query
// parameter in the endpoint's section or in its Conventions.
func TestOpenAPIParameters(t *testing.T) {
	funcs := serverFuncs(t)
	doc := openapiRaw(t)
	paths := doc["paths"].(map[string]any)
	guide, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	conventions, _, _ := strings.Cut(string(guide), "\n## Errors")
	brace := regexp.MustCompile(`\{(\w+)\}`)
	for _, rc := range routeCalls(t, funcs) {
		method, p, _ := strings.Cut(rc.pattern, " ")
		item, ok := paths[p].(map[string]any)
		if !ok {
			continue // TestRoutesDocumented
		}
		op, ok := item[strings.ToLower(method)].(map[string]any)
		if !ok {
			continue
		}
		byIn := map[string][]string{}
		for _, list := range []any{item["parameters"], op["parameters"]} {
			ps, _ := list.([]any)
			for _, x := range ps {
				prm := x.(map[string]any)
				in, _ := prm["in"].(string)
				name, _ := prm["name"].(string)
				byIn[in] = append(byIn[in], name)
			}
		}
		query := queryNames(t, rc.query)
		slices.Sort(byIn["query"])
		if !slices.Equal(query, byIn["query"]) {
			t.Errorf("%s takes the query parameters %v; openapi.json lists %v", rc.pattern, query, byIn["query"])
		}
		var pathParams []string
		for _, m := range brace.FindAllStringSubmatch(p, -1) {
			pathParams = append(pathParams, m[1])
		}
		slices.Sort(byIn["path"])
		if !slices.Equal(pathParams, byIn["path"]) {
			t.Errorf("%s has the path parameters %v; openapi.json lists %v", rc.pattern, pathParams, byIn["path"])
		}
		_, sec, _ := strings.Cut(string(guide), "#### `"+rc.pattern)
		sec, _, _ = strings.Cut(sec, "\n#### ")
		for _, q := range query {
			if !strings.Contains(sec, "`"+q+"`") && !strings.Contains(sec, q+"=") && !strings.Contains(conventions, "`"+q+"`") {
				t.Errorf("docs/api.md does not name the query parameter %s of %s", q, rc.pattern)
			}
		}
	}
}

// notControlAPICodes are codes the source defines that the control API
// never answers, with where they are answered instead.
var notControlAPICodes = map[string]string{
	"ServedByAnotherNode": "volume: refused at the NBD handshake of an attachment served by another node (docs/cluster.md)",
	"NodeRemoved":         "cluster.Register: a removed node refuses to start (docs/cluster.md)",
}

// codeSources are the packages whose errors reach the control API
// (internal/cli, internal/client and internal/server are the command,
// its client and the node's start-up, not the API).
var codeSources = []string{"api", "errs", "volume", "user", "meta", "cluster", "objects", "block", "store", "lock", "pki", "keys", "jsonstrict", "size", "nbd"}

// sourceCodes are the error codes the source of the packages behind the
// API defines or answers: Code… constants with a string value, and
// string literals given as the code to errs.New, errs.Invalid and
// errs.Conflict; with where each is.
func sourceCodes(t *testing.T) map[string]string {
	t.Helper()
	constDef := regexp.MustCompile(`(?m)^\s*(?:const\s+)?Code\w*\s*=\s*"(\w+)"`)
	literal := regexp.MustCompile(`errs\.(?:New\(errs\.Kind\w+,|Invalid\(|Conflict\()\s*"(\w+)"`)
	out := map[string]string{}
	for _, pkg := range codeSources {
		dir := filepath.Join("..", pkg)
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, re := range []*regexp.Regexp{constDef, literal} {
				for _, m := range re.FindAllSubmatchIndex(b, -1) {
					code := string(b[m[2]:m[3]])
					line := 1 + strings.Count(string(b[:m[0]]), "\n")
					if _, ok := out[code]; !ok {
						out[code] = path + ":" + strconv.Itoa(line)
					}
				}
			}
			return nil
		})
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	if len(out) < 40 {
		t.Fatalf("found only %d codes in the source", len(out))
	}
	return out
}

// TestSourceErrorCodesDocumented: every error code the packages behind
// the API define or answer is in the error tables of docs/api.md and of
// openapi.json (or in notControlAPICodes, saying why not); and no code
// those tables or an operation's x-error-codes name is dead: each is in
// the source. TestErrorCodesDocumented checks a list kept by hand, which
// a code added to volume or cluster did not join.
func TestSourceErrorCodesDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	guide := errorTable(string(b))
	doc := readOpenAPI(t)
	spec := errorTable(doc.Info.Description)
	src := sourceCodes(t)
	for _, c := range slices.Sorted(maps.Keys(src)) {
		if why, ok := notControlAPICodes[c]; ok {
			if _, documented := guide[c]; documented {
				t.Errorf("code %s is in docs/api.md's error table, but notControlAPICodes says: %s", c, why)
			}
			continue
		}
		if _, ok := guide[c]; !ok {
			t.Errorf("code %s (%s) is not in the error table of docs/api.md", c, src[c])
		}
		if _, ok := spec[c]; !ok {
			t.Errorf("code %s (%s) is not in the error table of openapi.json's info", c, src[c])
		}
	}
	for c := range notControlAPICodes {
		if _, ok := src[c]; !ok {
			t.Errorf("notControlAPICodes names %s, which the source no longer has", c)
		}
	}
	dead := func(where string, codes []string) {
		for _, c := range codes {
			if _, ok := src[c]; !ok {
				t.Errorf("%s names code %s, which nothing in the source answers", where, c)
			}
		}
	}
	dead("docs/api.md's error table", slices.Sorted(maps.Keys(guide)))
	dead("openapi.json's error table", slices.Sorted(maps.Keys(spec)))
	ops := doc.operations(t)
	for _, name := range slices.Sorted(maps.Keys(ops)) {
		dead(name+" (x-error-codes)", ops[name].ErrorCodes)
	}
}

// TestSharedResponsesErrorCodes: the codes a shared response
// (components/responses) lists are among the x-error-codes of every
// operation that refers to it. TestErrorCodesDocumented reads only
// responses written in the operation, not those it refers to.
func TestSharedResponsesErrorCodes(t *testing.T) {
	doc := openapiRaw(t)
	shared := doc["components"].(map[string]any)["responses"].(map[string]any)
	listed := regexp.MustCompile("- `(\\w+)`")
	ops := readOpenAPI(t).operations(t)
	checked := 0
	for _, name := range slices.Sorted(maps.Keys(ops)) {
		op := ops[name]
		for status, raw := range op.Responses {
			var r struct {
				Ref string `json:"$ref"`
			}
			json.Unmarshal(raw, &r)
			if r.Ref == "" {
				continue
			}
			target, ok := shared[strings.TrimPrefix(r.Ref, "#/components/responses/")].(map[string]any)
			if !ok {
				t.Errorf("%s: its %s response refers to %s, which does not exist", name, status, r.Ref)
				continue
			}
			desc, _ := target["description"].(string)
			for _, m := range listed.FindAllStringSubmatch(desc, -1) {
				checked++
				if !slices.Contains(op.ErrorCodes, m[1]) {
					t.Errorf("%s: its %s response (%s) has code %s, which is not among its x-error-codes %v", name, status, r.Ref, m[1], op.ErrorCodes)
				}
			}
		}
	}
	if checked < 50 {
		t.Fatalf("checked only %d codes of shared responses", checked)
	}
}
