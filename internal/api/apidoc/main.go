// Command apidoc renders the OpenAPI documents of SPACE's two HTTP APIs,
// the control API (internal/api/openapi.json) and the data plane
// (internal/dataplane/openapi.json), into the Markdown reference
// docs/api.md. Run it from the repository root after changing either
// document:
//
//	go run ./internal/api/apidoc > docs/api.md
//
// It reads the documents the server embeds (api.OpenAPI, dataplane.OpenAPI),
// so the reference describes exactly what /openapi.json serves. Its test
// fails when docs/api.md differs from what it produces, or when a link in
// the reference has no anchor.
package main

import (
	"fmt"
	"os"

	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/dataplane"
)

func main() {
	out, err := generate()
	if err != nil {
		fmt.Fprintln(os.Stderr, "apidoc:", err)
		os.Exit(1)
	}
	if _, err := os.Stdout.WriteString(out); err != nil {
		fmt.Fprintln(os.Stderr, "apidoc:", err)
		os.Exit(1)
	}
}

// generate renders both documents.
func generate() (string, error) {
	var planes []*plane
	for _, p := range []struct {
		id, title, file string
		doc             []byte
	}{
		{"control", "Control API", "internal/api/openapi.json", api.OpenAPI()},
		{"data", "Data plane", "internal/dataplane/openapi.json", dataplane.OpenAPI()},
	} {
		doc, err := parse(p.doc)
		if err != nil {
			return "", fmt.Errorf("%s: %w", p.file, err)
		}
		planes = append(planes, &plane{id: p.id, title: p.title, file: p.file, doc: doc})
	}
	return render(planes)
}
