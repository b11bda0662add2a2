package dataplane

import (
	"errors"
	"net/http"
	"path"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/httpx"
)

func FuzzCleanPath(f *testing.F) {
	for _, s := range []string{"/", "/etc/passwd", "../../etc", "/a/../../b", "a\x00b", "", "//x//y/", strings.Repeat("/a", 3000)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		out, err := CleanPath(in)
		if err != nil {
			var he *httpx.Error
			if !errors.As(err, &he) || he.Status != http.StatusBadRequest {
				t.Fatalf("CleanPath(%q) error is not a 400: %v", in, err)
			}
			return
		}
		if !strings.HasPrefix(out, "/") || strings.Contains(out, "\x00") || path.Clean(out) != out {
			t.Fatalf("CleanPath(%q) = %q: not clean and absolute", in, out)
		}
		for _, part := range strings.Split(out, "/") {
			if part == ".." {
				t.Fatalf("CleanPath(%q) = %q keeps ..", in, out)
			}
		}
	})
}

func FuzzDecodeSpec(f *testing.F) {
	for _, s := range []string{`{"argv":["true"]}`, `{"shell":"echo hi","env":{"A":"b"},"cwd":"/tmp"}`,
		`{"argv":["x"],"pty":{"cols":0,"rows":1}}`, `{"argv":[],"shell":""}`, `{"argv":["a"],"bogus":1}`, `[`, `{"timeout_ms":-1,"argv":["a"]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		spec, err := DecodeSpec(body)
		if err != nil {
			var he *httpx.Error
			if !errors.As(err, &he) || he.Status/100 != 4 {
				t.Fatalf("DecodeSpec error is not a 4xx: %v", err)
			}
			return
		}
		if (len(spec.Argv) == 0) == (spec.Shell == "") {
			t.Fatalf("accepted a spec without exactly one of argv/shell: %+v", spec)
		}
		if spec.Cwd != "" && !strings.HasPrefix(spec.Cwd, "/") {
			t.Fatalf("accepted relative cwd %q", spec.Cwd)
		}
		if spec.TimeoutMs < 0 {
			t.Fatal("accepted a negative timeout")
		}
	})
}
