package policy

import (
	"encoding/json"
	"errors"
	"testing"
)

func TestDecodeRuleObject(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`"api.test:443 GET /v1/*"`, "api.test:443 GET /v1/*"},
		{`{"host": "API.Test."}`, "api.test:80,443"},
		{`{"host": "api.test", "ports": [443, 80], "methods": ["GET", "HEAD"], "paths": ["/v1/*", "/health"]}`, "api.test:80,443 GET,HEAD /v1/*,/health"},
		{`{"host": "*.registry.test", "ports": [443]}`, "*.registry.test:443"},
	} {
		got, err := DecodeRule(json.RawMessage(c.in))
		if err != nil || got != c.want {
			t.Errorf("DecodeRule(%s) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{
		`{}`, `{"host": "api.test:443"}`, `{"host": "api.test GET"}`, `{"host": "1.2.3.4"}`,
		`{"host": "api.test", "ports": [0]}`, `{"host": "api.test", "ports": [65536]}`,
		`{"host": "api.test", "methods": ["GET /x"]}`, `{"host": "api.test", "methods": ["get"]}`, `{"host": "api.test", "methods": ["CONNECT"]}`,
		`{"host": "api.test", "paths": ["v1"]}`, `{"host": "api.test", "paths": ["/v1/../x"]}`, `{"host": "api.test", "paths": ["/a,/b"]}`,
		`{"host": "api.test", "extra": 1}`, `42`, `["api.test"]`, `null`,
	} {
		if got, err := DecodeRule(json.RawMessage(in)); !errors.Is(err, ErrInvalid) {
			t.Errorf("DecodeRule(%s) = %q, %v; want ErrInvalid", in, got, err)
		}
	}
}
