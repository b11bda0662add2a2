package docs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/space-sandbox/space/test/attrs"
)

// TestSecurityAttributesTable: docs/security.md carries the table of
// security attributes by creation path exactly as test/attrs defines (and
// tests) it. SPACE_UPDATE_DOCS=1 rewrites the table in place.
func TestSecurityAttributesTable(t *testing.T) {
	path := filepath.Join("..", "..", "docs", "security.md")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- attrs table: test/attrs/table.go -->\n", "<!-- end attrs table -->\n"
	doc := string(b)
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	if i < 0 || j < i {
		t.Fatalf("%s has no %q ... %q section", path, begin, end)
	}
	want := attrs.Markdown()
	if got := doc[i+len(begin) : j]; got != want {
		if os.Getenv("SPACE_UPDATE_DOCS") == "1" {
			if err := os.WriteFile(path, []byte(doc[:i+len(begin)]+want+doc[j:]), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Errorf("the attributes table in %s differs from test/attrs.Markdown() (SPACE_UPDATE_DOCS=1 rewrites it):\n%s", path, want)
	}
}
