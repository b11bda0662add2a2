package openapitest

import (
	"encoding/json"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// Documents reports whether doc lists status among the responses of the
// operation METHOD pattern (pattern as in the document's paths, e.g.
// "/v1/sandboxes/{id}"). Integration tests use it to check that what a
// route really answered is documented for that route.
func Documents(doc []byte, method, pattern string, status int) bool {
	var d struct {
		Paths map[string]map[string]struct {
			Responses map[string]json.RawMessage `json:"responses"`
		} `json:"paths"`
	}
	if json.Unmarshal(doc, &d) != nil {
		return false
	}
	op, ok := d.Paths[pattern][strings.ToLower(method)]
	if !ok {
		return false
	}
	_, ok = op.Responses[strconv.Itoa(status)]
	return ok
}

// ErrorCodes returns the documented error codes: the enum of the Error
// schema's error.code.
func ErrorCodes(t *testing.T, doc []byte) map[string]bool {
	t.Helper()
	var d struct {
		Components struct {
			Schemas struct {
				Error struct {
					Properties struct {
						Error struct {
							Properties struct {
								Code struct {
									Enum []string `json:"enum"`
								} `json:"code"`
							} `json:"properties"`
						} `json:"error"`
					} `json:"properties"`
				} `json:"Error"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(doc, &d); err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, c := range d.Components.Schemas.Error.Properties.Error.Properties.Code.Enum {
		out[c] = true
	}
	if len(out) == 0 {
		t.Fatal("the Error schema has no enum of error codes")
	}
	return out
}

// Pair is one (status, code) a server can answer, and where.
type Pair struct {
	Status int
	Code   string // "" where only the status is known (a success, WriteHeader)
	Pos    string
}

// Scan is what a static read of Go packages finds: for every function,
// the status/code pairs it answers itself and the functions it calls.
type Scan struct {
	funcs   map[string]*scanFunc // "pkg.Func" or "pkg.Recv.Method"
	routes  map[string]map[string]string
	statusN map[string]int
}

type scanFunc struct {
	pairs []Pair
	calls []string
}

// Generic are the functions whose answers belong to no route in
// particular (the core-error mapping); a route's closure stops at them.
var Generic = map[string]bool{"httpx.StatusOf": true, "httpx.WriteError": true}

// ScanPackages reads the non-test Go files of dirs (paths from the
// repository root). Found: every call that passes an HTTP status and then
// a snake_case code (httpx.Errorf(http.StatusNotFound, "not_found", …),
// writeError(w, status, CodeX, …)), every return of a status and a code
// (httpx.StatusOf), every status given to WriteJSON or WriteHeader, and
// http.MaxBytesReader (413 body_too_large).
func ScanPackages(t *testing.T, dirs ...string) *Scan {
	t.Helper()
	s := &Scan{funcs: map[string]*scanFunc{}, routes: map[string]map[string]string{}, statusN: httpStatuses(t)}
	root := repoRoot(t)
	for _, dir := range dirs {
		fset := token.NewFileSet()
		names, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
		if err != nil || len(names) == 0 {
			t.Fatalf("%s: no Go files (%v)", dir, err)
		}
		pkgs := map[string][]*ast.File{}
		for _, n := range names {
			if strings.HasSuffix(n, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, n, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			pkgs[f.Name.Name] = append(pkgs[f.Name.Name], f)
		}
		for name, files := range pkgs {
			s.scanPackage(fset, dir, name, files)
		}
	}
	return s
}

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		up := filepath.Dir(dir)
		if up == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = up
	}
}

// httpStatuses reads net/http's Status* constants from its source.
func httpStatuses(t *testing.T) map[string]int {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(build.Default.GOROOT, "src", "net", "http", "status.go"), nil, 0)
	if err != nil {
		t.Fatalf("net/http status constants: %v", err)
	}
	out := map[string]int{}
	for name, lit := range literalConsts([]*ast.File{f}, token.INT) {
		out[name], _ = strconv.Atoi(lit)
	}
	if out["StatusNotFound"] != 404 {
		t.Fatal("could not read net/http's status constants")
	}
	return out
}

// literalConsts returns the constants of files given as a literal of kind,
// name to the literal's source text.
func literalConsts(files []*ast.File, kind token.Token) map[string]string {
	out := map[string]string{}
	for _, f := range files {
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if i < len(vs.Values) {
						if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == kind {
							out[n.Name] = lit.Value
						}
					}
				}
			}
		}
	}
	return out
}

var codeRE = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

func (s *Scan) scanPackage(fset *token.FileSet, dir, pkgName string, files []*ast.File) {
	consts := map[string]string{} // string constants of the package
	for name, lit := range literalConsts(files, token.STRING) {
		consts[name], _ = strconv.Unquote(lit)
	}
	status := func(e ast.Expr) (int, bool) {
		switch e := e.(type) {
		case *ast.SelectorExpr:
			if x, ok := e.X.(*ast.Ident); ok && x.Name == "http" {
				v, ok := s.statusN[e.Sel.Name]
				return v, ok
			}
		case *ast.BasicLit:
			if v, err := strconv.Atoi(e.Value); err == nil && v >= 100 && v <= 599 {
				return v, true
			}
		}
		return 0, false
	}
	code := func(e ast.Expr) (string, bool) {
		var v string
		switch e := e.(type) {
		case *ast.BasicLit:
			if e.Kind != token.STRING {
				return "", false
			}
			v, _ = strconv.Unquote(e.Value)
		case *ast.Ident:
			var ok bool
			if v, ok = consts[e.Name]; !ok {
				return "", false
			}
		default:
			return "", false
		}
		return v, codeRE.MatchString(v)
	}
	for _, f := range files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			key, recvVar := pkgName+"."+fd.Name.Name, ""
			if fd.Recv != nil && len(fd.Recv.List) == 1 {
				rt := fd.Recv.List[0].Type
				if st, ok := rt.(*ast.StarExpr); ok {
					rt = st.X
				}
				if id, ok := rt.(*ast.Ident); ok {
					key = pkgName + "." + id.Name + "." + fd.Name.Name
					if len(fd.Recv.List[0].Names) == 1 {
						recvVar = fd.Recv.List[0].Names[0].Name
					}
				}
			}
			recvType := strings.TrimSuffix(strings.TrimPrefix(key, pkgName+"."), "."+fd.Name.Name)
			sf := &scanFunc{}
			s.funcs[key] = sf
			pos := func(n ast.Node) string {
				p := fset.Position(n.Pos())
				return filepath.Join(dir, filepath.Base(p.Filename)) + ":" + strconv.Itoa(p.Line)
			}
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.CallExpr:
					switch fn := n.Fun.(type) {
					case *ast.Ident:
						sf.calls = append(sf.calls, pkgName+"."+fn.Name)
					case *ast.SelectorExpr:
						if x, ok := fn.X.(*ast.Ident); ok {
							switch {
							case x.Name == recvVar && recvVar != "":
								sf.calls = append(sf.calls, pkgName+"."+recvType+"."+fn.Sel.Name)
							case x.Name == "http" && fn.Sel.Name == "MaxBytesReader":
								sf.pairs = append(sf.pairs, Pair{413, "body_too_large", pos(n)})
							default:
								sf.calls = append(sf.calls, x.Name+"."+fn.Sel.Name)
							}
						}
						// w.WriteHeader(status), httpx.WriteJSON(w, status, v)
						arg := -1
						switch {
						case fn.Sel.Name == "WriteHeader" && len(n.Args) == 1:
							arg = 0
						case fn.Sel.Name == "WriteJSON" && len(n.Args) == 3:
							arg = 1
						}
						if arg >= 0 {
							if v, ok := status(n.Args[arg]); ok {
								sf.pairs = append(sf.pairs, Pair{v, "", pos(n)})
							}
						}
					}
					for i := 0; i+1 < len(n.Args); i++ {
						if v, ok := status(n.Args[i]); ok && v >= 400 {
							if c, ok := code(n.Args[i+1]); ok {
								sf.pairs = append(sf.pairs, Pair{v, c, pos(n)})
							}
							break
						}
					}
				case *ast.ReturnStmt:
					if len(n.Results) >= 2 {
						if v, ok := status(n.Results[0]); ok && v >= 400 {
							if c, ok := code(n.Results[1]); ok {
								sf.pairs = append(sf.pairs, Pair{v, c, pos(n)})
							}
						}
					}
				case *ast.CompositeLit:
					s.scanRoute(pkgName, n)
				}
				return true
			})
		}
		// Route tables are package-level variables.
		for _, d := range f.Decls {
			if gd, ok := d.(*ast.GenDecl); ok && gd.Tok == token.VAR {
				ast.Inspect(gd, func(n ast.Node) bool {
					if cl, ok := n.(*ast.CompositeLit); ok {
						s.scanRoute(pkgName, cl)
					}
					return true
				})
			}
		}
	}
}

// scanRoute records a route-table entry: {"METHOD", "/pattern", …,
// (*Recv).handler}.
func (s *Scan) scanRoute(pkgName string, cl *ast.CompositeLit) {
	if len(cl.Elts) < 3 {
		return
	}
	var strs []string
	handler := ""
	for _, e := range cl.Elts {
		switch e := e.(type) {
		case *ast.BasicLit:
			if e.Kind == token.STRING {
				v, _ := strconv.Unquote(e.Value)
				strs = append(strs, v)
			}
		case *ast.SelectorExpr:
			if p, ok := e.X.(*ast.ParenExpr); ok {
				if st, ok := p.X.(*ast.StarExpr); ok {
					if id, ok := st.X.(*ast.Ident); ok {
						handler = pkgName + "." + id.Name + "." + e.Sel.Name
					}
				}
			}
		}
	}
	if handler == "" || len(strs) < 2 || strings.ToUpper(strs[0]) != strs[0] || !strings.HasPrefix(strs[1], "/") {
		return
	}
	if s.routes[pkgName] == nil {
		s.routes[pkgName] = map[string]string{}
	}
	s.routes[pkgName][strs[0]+" "+strs[1]] = handler
}

// Routes maps "METHOD /pattern" to its handler for a package's route table.
func (s *Scan) Routes(pkgName string) map[string]string { return s.routes[pkgName] }

// All returns every pair found in the scanned packages.
func (s *Scan) All() []Pair {
	var out []Pair
	keys := make([]string, 0, len(s.funcs))
	for k := range s.funcs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		out = append(out, s.funcs[k].pairs...)
	}
	return out
}

// Of returns the pairs of the given functions, with every function they
// call among the scanned ones, transitively (stopping at Generic).
func (s *Scan) Of(roots ...string) []Pair {
	seen := map[string]bool{}
	var out []Pair
	var walk func(k string)
	walk = func(k string) {
		if seen[k] || Generic[k] {
			return
		}
		seen[k] = true
		f, ok := s.funcs[k]
		if !ok {
			return
		}
		out = append(out, f.pairs...)
		for _, c := range f.calls {
			walk(c)
		}
	}
	for _, r := range roots {
		walk(r)
	}
	return out
}

// CheckCodes fails for every code of pairs that the document's Error code
// enum lacks, for every status of pairs that no operation documents, and
// for every documented code that nothing produces (extra lists codes made
// where the scan cannot see them).
func CheckCodes(t *testing.T, doc []byte, pairs []Pair, extra ...string) {
	t.Helper()
	enum := ErrorCodes(t, doc)
	produced := map[string]bool{}
	for _, c := range extra {
		produced[c] = true
	}
	documented := documentedStatuses(t, doc)
	for _, p := range pairs {
		if p.Status == 499 {
			continue // the client left: nothing is written
		}
		if p.Code != "" {
			produced[p.Code] = true
			if !enum[p.Code] {
				t.Errorf("%s: error code %q (status %d) is not in the Error schema's code enum", p.Pos, p.Code, p.Status)
			}
		}
		if !documented[p.Status] {
			t.Errorf("%s: status %d (%s) is documented on no route", p.Pos, p.Status, p.Code)
		}
	}
	for c := range enum {
		if !produced[c] {
			t.Errorf("the Error schema documents code %q, which nothing answers", c)
		}
	}
}

func documentedStatuses(t *testing.T, doc []byte) map[int]bool {
	t.Helper()
	var d struct {
		Paths map[string]map[string]struct {
			Responses map[string]json.RawMessage `json:"responses"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(doc, &d); err != nil {
		t.Fatal(err)
	}
	out := map[int]bool{}
	for _, ops := range d.Paths {
		for _, op := range ops {
			for st := range op.Responses {
				if n, err := strconv.Atoi(st); err == nil {
					out[n] = true
				}
			}
		}
	}
	return out
}

// CheckRouteStatuses fails for every route of the package's route table
// whose documented responses lack a status its handler (with the
// functions it calls, and wrappers, which every route goes through)
// answers, or one that every route of this kind can answer: 500, 414 and
// 431 (httpx.Limits) on all, 401 on the authenticated (not in public), 415
// where the route documents a request body (httpx.ContentTypes).
func CheckRouteStatuses(t *testing.T, doc []byte, s *Scan, pkgName string, public map[string]bool, wrappers ...string) {
	t.Helper()
	routes := s.Routes(pkgName)
	if len(routes) == 0 {
		t.Fatalf("no route table found in package %s", pkgName)
	}
	bodies := map[string]bool{}
	var d struct {
		Paths map[string]map[string]struct {
			RequestBody json.RawMessage `json:"requestBody"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(doc, &d); err != nil {
		t.Fatal(err)
	}
	for path, ops := range d.Paths {
		for m, op := range ops {
			if op.RequestBody != nil {
				bodies[strings.ToUpper(m)+" "+path] = true
			}
		}
	}
	keys := make([]string, 0, len(routes))
	for k := range routes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, route := range keys {
		method, pattern, _ := strings.Cut(route, " ")
		want := []Pair{{500, "internal", "every route"}, {414, "uri_too_long", "httpx.Limits"}, {431, "header_too_large", "httpx.Limits"}}
		roots := []string{routes[route]}
		if !public[route] {
			want = append(want, Pair{401, "unauthorized", "authentication"})
			roots = append(roots, wrappers...)
		}
		if bodies[route] {
			want = append(want, Pair{415, "unsupported_media_type", "httpx.ContentTypes"})
		}
		want = append(want, s.Of(roots...)...)
		for _, p := range want {
			if !Documents(doc, method, pattern, p.Status) {
				t.Errorf("%s answers %d %s (%s), which its documented responses lack", route, p.Status, p.Code, p.Pos)
			}
		}
	}
}
