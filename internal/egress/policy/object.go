package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// RuleObject is an allow rule in JSON-object form, the structured
// equivalent of the string form "host[:port,...][ METHODS][ PATHS]":
//
//	{"host": "api.example.com", "ports": [443], "methods": ["GET", "HEAD"], "paths": ["/v1/*"]}
//
// Only host is required; no ports means 80 and 443. Each field is checked
// on its own (no separators smuggled inside a field) and the whole rule
// then goes through ParseRule, so both forms obey exactly the same rules.
type RuleObject struct {
	Host    string   `json:"host"`
	Ports   []int    `json:"ports,omitempty"`
	Methods []string `json:"methods,omitempty"`
	Paths   []string `json:"paths,omitempty"`
}

// Rule validates the object and returns it in canonical string form.
func (o RuleObject) Rule() (string, error) {
	bad := func(what, v string) error {
		return fmt.Errorf("%w: rule object: bad %s %.80q", ErrInvalid, what, v)
	}
	if o.Host == "" || strings.ContainsAny(o.Host, " ,:") {
		return "", bad("host", o.Host)
	}
	s := o.Host
	if len(o.Ports) > 0 {
		ps := make([]string, len(o.Ports))
		for i, p := range o.Ports {
			if p < 1 || p > 65535 {
				return "", bad("port", strconv.Itoa(p))
			}
			ps[i] = strconv.Itoa(p)
		}
		s += ":" + strings.Join(ps, ",")
	}
	for _, m := range o.Methods {
		if m == "" || strings.ContainsAny(m, " ,/") {
			return "", bad("method", m)
		}
	}
	for _, p := range o.Paths {
		if !strings.HasPrefix(p, "/") || strings.ContainsAny(p, " ,") {
			return "", bad("path", p)
		}
	}
	if len(o.Methods) > 0 {
		s += " " + strings.Join(o.Methods, ",")
	}
	if len(o.Paths) > 0 {
		s += " " + strings.Join(o.Paths, ",")
	}
	r, err := ParseRule(s)
	if err != nil {
		return "", err
	}
	return r.String(), nil
}

// DecodeRule decodes one element of an allow list: a JSON string (the
// rule as written) or a RuleObject (unknown fields refused). Objects come
// back in canonical string form.
func DecodeRule(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", fmt.Errorf("%w: %v", ErrInvalid, err)
		}
		return s, nil
	}
	if len(raw) == 0 || raw[0] != '{' {
		return "", fmt.Errorf("%w: an allow rule is a string or an object", ErrInvalid)
	}
	var o RuleObject
	d := json.NewDecoder(bytes.NewReader(raw))
	d.DisallowUnknownFields()
	if err := d.Decode(&o); err != nil {
		return "", fmt.Errorf("%w: rule object: %v", ErrInvalid, err)
	}
	return o.Rule()
}
