package e2b

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/httpx"
)

// The E2B routes read JSON as the SDKs send it (application/json) and a
// body without a Content-Type; any other media type is 415.
func TestDecodeContentType(t *testing.T) {
	cases := []struct {
		ct, body string
		status   int
	}{
		{"application/json", `{"timeout":5}`, 0},
		{"application/json; charset=utf-8", `{"timeout":5}`, 0},
		{"", `{"timeout":5}`, 0},
		{"text/plain", `{"timeout":5}`, 415},
		{"application/x-www-form-urlencoded", `{"timeout":5}`, 415},
		{"text/plain", ``, 0}, // no body: nothing to read
	}
	for _, c := range cases {
		r := httptest.NewRequest("POST", "/sandboxes/x/timeout", strings.NewReader(c.body))
		if c.ct != "" {
			r.Header.Set("Content-Type", c.ct)
		}
		var v struct{ Timeout *int64 }
		err := decode(httptest.NewRecorder(), r, &v, false)
		st := 0
		if err != nil {
			st, _, _ = httpx.StatusOf(err)
		}
		if st != c.status {
			t.Errorf("%q %q: status %d (%v), want %d", c.ct, c.body, st, err, c.status)
		}
	}
}
