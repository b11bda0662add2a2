package httpx

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/core"
)

func TestDecodeJSON(t *testing.T) {
	cases := []struct {
		body string
		code string
		st   int
	}{
		{`{"template":"x"}`, "", 0},
		{``, "invalid_json", 400},
		{`{"template":`, "invalid_json", 400},
		{`{"template":1}`, "invalid_json", 400},
		{`{"nope":1}`, "unknown_field", 400},
		{`{"template":"x"}{}`, "invalid_json", 400},
		{`{"template":"` + strings.Repeat("a", MaxJSONBody) + `"}`, "body_too_large", 413},
	}
	for _, c := range cases {
		r := httptest.NewRequest("POST", "/", strings.NewReader(c.body))
		w := httptest.NewRecorder()
		var req core.CreateRequest
		err := DecodeJSON(w, r, &req)
		if c.st == 0 {
			if err != nil {
				t.Errorf("%.30q: %v", c.body, err)
			}
			continue
		}
		st, code, _ := StatusOf(err)
		if st != c.st || code != c.code {
			t.Errorf("%.30q: %d %s, want %d %s", c.body, st, code, c.st, c.code)
		}
	}
}

func TestStatusOfHidesInternalErrors(t *testing.T) {
	st, code, msg := StatusOf(errors.New("secret path /var/lib/x"))
	if st != http.StatusInternalServerError || code != "internal" || strings.Contains(msg, "secret") {
		t.Fatalf("internal error leaked: %d %s %s", st, code, msg)
	}
}

func FuzzDecodeCreateRequest(f *testing.F) {
	for _, s := range []string{`{"template":"base","env":{"A":"1"},"metadata":{"k":"v"},"limits":{"cpu_millis":500},"timeout_seconds":10}`,
		`{"template":null}`, `{}`, `{"limits":{"memory_bytes":1e400}}`, `{"env":{"":""}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var req core.CreateRequest
		if err := DecodeStrict(body, &req); err != nil {
			if st, _, _ := StatusOf(err); st != 400 {
				t.Fatalf("decode error maps to %d: %v", st, err)
			}
		}
	})
}
