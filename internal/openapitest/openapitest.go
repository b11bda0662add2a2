// Package openapitest checks a served OpenAPI 3 document against the routes
// a handler really serves; the control API and the data plane share it.
package openapitest

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// CheckRoutes fails unless the document describes exactly routes ("METHOD
// /pattern"): a route added without docs, or docs for a route that is gone.
// public are the routes documented and served without credentials.
func CheckRoutes(t *testing.T, docJSON []byte, routes []string, public map[string]bool) {
	t.Helper()
	var doc struct {
		OpenAPI  string                                `json:"openapi"`
		Security []map[string][]string                 `json:"security"`
		Paths    map[string]map[string]json.RawMessage `json:"paths"`
	}
	var root any
	if err := json.Unmarshal(docJSON, &doc); err != nil {
		t.Fatalf("openapi.json does not parse: %v", err)
	}
	json.Unmarshal(docJSON, &root)
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Fatalf("openapi = %q, want 3.x", doc.OpenAPI)
	}
	if len(doc.Security) == 0 {
		t.Fatal("no top-level security requirement")
	}
	want := map[string]bool{}
	for _, r := range routes {
		want[r] = true
	}
	got := map[string]bool{}
	opIDs := map[string]string{}
	params := regexp.MustCompile(`\{([^}]+)\}`)
	for path, ops := range doc.Paths {
		for method, raw := range ops {
			if method == "parameters" || method == "summary" || method == "description" {
				continue
			}
			key := strings.ToUpper(method) + " " + path
			got[key] = true
			var op struct {
				OperationID string                     `json:"operationId"`
				Security    *[]map[string][]string     `json:"security"`
				Parameters  []map[string]any           `json:"parameters"`
				Responses   map[string]json.RawMessage `json:"responses"`
			}
			if err := json.Unmarshal(raw, &op); err != nil {
				t.Errorf("%s: %v", key, err)
				continue
			}
			if op.OperationID == "" {
				t.Errorf("%s: no operationId", key)
			} else if prev, dup := opIDs[op.OperationID]; dup {
				t.Errorf("%s: operationId %q also used by %s", key, op.OperationID, prev)
			}
			opIDs[op.OperationID] = key
			if len(op.Responses) == 0 {
				t.Errorf("%s: no responses", key)
			}
			public := public[key]
			if open := op.Security != nil && len(*op.Security) == 0; open != public {
				t.Errorf("%s: documented as public=%v, served as public=%v", key, open, public)
			}
			declared := map[string]bool{}
			for _, p := range op.Parameters {
				if r, ok := p["$ref"].(string); ok {
					p = lookup(t, root, r)
				}
				if p["in"] == "path" {
					declared[p["name"].(string)] = true
				}
			}
			for _, m := range params.FindAllStringSubmatch(path, -1) {
				if !declared[m[1]] {
					t.Errorf("%s: path parameter %q not declared", key, m[1])
				}
			}
		}
	}
	for r := range want {
		if !got[r] {
			t.Errorf("route %s is served but not documented in openapi.json", r)
		}
	}
	for r := range got {
		if !want[r] {
			t.Errorf("openapi.json documents %s, which is not served", r)
		}
	}
}

// CheckRefs fails unless every $ref in the document resolves.
func CheckRefs(t *testing.T, docJSON []byte) {
	t.Helper()
	var root any
	if err := json.Unmarshal(docJSON, &root); err != nil {
		t.Fatal(err)
	}
	var refs []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && k == "$ref" {
					refs = append(refs, s)
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(root)
	sort.Strings(refs)
	if len(refs) == 0 {
		t.Fatal("no $ref at all; the document looks truncated")
	}
	for _, r := range refs {
		lookup(t, root, r)
	}
}

// CheckServed fails unless h serves docJSON at GET /openapi.json.
func CheckServed(t *testing.T, h http.Handler, docJSON []byte) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/openapi.json", nil))
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" || rec.Body.String() != string(docJSON) {
		t.Fatalf("GET /openapi.json: %d %q", rec.Code, rec.Header().Get("Content-Type"))
	}
}

// openapiLookup resolves a local JSON pointer such as
// #/components/schemas/Error in the parsed document root.
func lookup(t *testing.T, root any, ref string) map[string]any {
	t.Helper()
	cur := root
	if !strings.HasPrefix(ref, "#/") {
		t.Fatalf("non-local $ref %q", ref)
	}
	for _, part := range strings.Split(ref[2:], "/") {
		part = strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")
		m, ok := cur.(map[string]any)
		if !ok {
			t.Fatalf("$ref %q does not resolve", ref)
		}
		if cur, ok = m[part]; !ok {
			t.Fatalf("$ref %q does not resolve", ref)
		}
	}
	m, ok := cur.(map[string]any)
	if !ok {
		t.Fatalf("$ref %q is not an object", ref)
	}
	return m
}
