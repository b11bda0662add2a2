package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// docPath is docs/api.md relative to this package's directory.
var docPath = filepath.Join("..", "..", "..", "docs", "api.md")

// TestAPIDocUpToDate fails when docs/api.md is not what the generator
// produces from the OpenAPI documents as they are now.
func TestAPIDocUpToDate(t *testing.T) {
	want, err := generate()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatalf("%v; create it with: go run ./internal/api/apidoc > docs/api.md", err)
	}
	if string(got) == want {
		return
	}
	gl, wl := strings.Split(string(got), "\n"), strings.Split(want, "\n")
	line := 0
	for line < len(gl) && line < len(wl) && gl[line] == wl[line] {
		line++
	}
	show := func(l []string) string {
		if line < len(l) {
			return l[line]
		}
		return "(end of file)"
	}
	t.Fatalf("docs/api.md is stale (first difference at line %d):\n  file:      %s\n  generated: %s\nregenerate it from the repository root: go run ./internal/api/apidoc > docs/api.md",
		line+1, show(gl), show(wl))
}

var (
	linkRE   = regexp.MustCompile(`\]\(#([^)]+)\)`)
	anchorRE = regexp.MustCompile(`<a id="([^"]+)"></a>`)
)

// TestEveryRouteAndSchemaRendered checks that every operation and schema of
// both documents has its anchor, that anchors are unique and that every
// in-page link lands on one.
func TestEveryRouteAndSchemaRendered(t *testing.T) {
	out, err := generate()
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]int{}
	for _, m := range anchorRE.FindAllStringSubmatch(out, -1) {
		anchors[m[1]]++
	}
	for a, n := range anchors {
		if n > 1 {
			t.Errorf("anchor %q defined %d times", a, n)
		}
	}
	for _, m := range linkRE.FindAllStringSubmatch(out, -1) {
		if anchors[m[1]] == 0 {
			t.Errorf("link to #%s has no anchor", m[1])
		}
	}
	for _, id := range []string{"control", "data"} {
		if anchors[id] == 0 {
			t.Errorf("no section %q", id)
		}
	}
	r := &renderer{}
	for _, p := range []struct{ id, file string }{{"control", "internal/api/openapi.json"}, {"data", "internal/dataplane/openapi.json"}} {
		raw, err := os.ReadFile(filepath.Join("..", "..", "..", p.file))
		if err != nil {
			t.Fatal(err)
		}
		doc, err := parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		r.p = &plane{id: p.id, file: p.file, doc: doc}
		ops := operations(doc)
		if len(ops) < 10 {
			t.Fatalf("%s: only %d operations", p.file, len(ops))
		}
		for _, o := range ops {
			if anchors[r.opAnchor(o)] != 1 {
				t.Errorf("%s: %s %s has no section", p.file, o.method, o.path)
			}
			if !strings.Contains(out, "#### "+strings.ToUpper(o.method)+" "+o.path+"\n") {
				t.Errorf("%s: no heading for %s %s", p.file, o.method, o.path)
			}
		}
		for _, name := range doc.obj("components").obj("schemas").keys {
			if anchors[r.schemaAnchor(name)] != 1 {
				t.Errorf("%s: schema %s has no section", p.file, name)
			}
		}
	}
}

func TestEscape(t *testing.T) {
	for in, want := range map[string]string{
		"Bearer <token>":       "Bearer &lt;token&gt;",
		"nft_* counters":       `nft_\* counters`,
		"a | b `x | <y>` c":    "a \\| b `x \\| <y>` c",
		"line\nnext":           "line<br>next",
		`no %, \, dots`:        `no %, \\, dots`,
		"`id: <seq>` and *.go": "`id: <seq>` and \\*.go",
	} {
		if got := esc(in, true); got != want {
			t.Errorf("esc(%q) = %q, want %q", in, got, want)
		}
	}
	if got := slug("control", "schema", "CreateSandboxRequest"); got != "control-schema-createsandboxrequest" {
		t.Errorf("slug = %q", got)
	}
}

func TestParseKeepsOrderAndRejectsDuplicates(t *testing.T) {
	o, err := parse([]byte(`{"b":1,"a":{"z":[1,"x"],"y":null}}`))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(o.keys, ",") != "b,a" || strings.Join(o.obj("a").keys, ",") != "z,y" {
		t.Fatalf("order lost: %v %v", o.keys, o.obj("a").keys)
	}
	if got := compact(o); got != `{"b":1,"a":{"z":[1,"x"],"y":null}}` {
		t.Fatalf("compact = %s", got)
	}
	for _, bad := range []string{`{"a":1,"a":2}`, `[1]`, `{"a":1} x`} {
		if _, err := parse([]byte(bad)); err == nil {
			t.Errorf("parse(%s) must fail", bad)
		}
	}
}
