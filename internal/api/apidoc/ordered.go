package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// object is a JSON object that keeps its keys in document order, so that
// routes, fields and responses come out in the order the OpenAPI documents
// list them.
type object struct {
	keys []string
	vals map[string]any
}

// get returns the value under k, or nil.
func (o *object) get(k string) any {
	if o == nil {
		return nil
	}
	return o.vals[k]
}

// obj returns the object under k, or nil.
func (o *object) obj(k string) *object {
	v, _ := o.get(k).(*object)
	return v
}

// str returns the string under k, or "".
func (o *object) str(k string) string {
	v, _ := o.get(k).(string)
	return v
}

// arr returns the array under k, or nil.
func (o *object) arr(k string) []any {
	v, _ := o.get(k).([]any)
	return v
}

// names returns the keys in document order; none for a nil object.
func (o *object) names() []string {
	if o == nil {
		return nil
	}
	return o.keys
}

// has says whether k is present.
func (o *object) has(k string) bool {
	if o == nil {
		return false
	}
	_, ok := o.vals[k]
	return ok
}

// parse decodes a JSON document into *object, []any, string, json.Number,
// bool and nil values.
func parse(data []byte) (*object, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := parseValue(dec)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("trailing data after the document")
	}
	o, ok := v.(*object)
	if !ok {
		return nil, fmt.Errorf("the document is not a JSON object")
	}
	return o, nil
}

func parseValue(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			o := &object{vals: map[string]any{}}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k, ok := kt.(string)
				if !ok {
					return nil, fmt.Errorf("object key %v is not a string", kt)
				}
				v, err := parseValue(dec)
				if err != nil {
					return nil, err
				}
				if _, dup := o.vals[k]; dup {
					return nil, fmt.Errorf("duplicate key %q", k)
				}
				o.keys = append(o.keys, k)
				o.vals[k] = v
			}
			_, err := dec.Token() // '}'
			return o, err
		case '[':
			a := []any{}
			for dec.More() {
				v, err := parseValue(dec)
				if err != nil {
					return nil, err
				}
				a = append(a, v)
			}
			_, err := dec.Token() // ']'
			return a, err
		}
		return nil, fmt.Errorf("unexpected %v", t)
	default:
		return t, nil
	}
}

// compact writes v back as compact JSON, keys in document order.
func compact(v any) string {
	var b strings.Builder
	writeJSON(&b, v)
	return b.String()
}

func writeJSON(b *strings.Builder, v any) {
	switch t := v.(type) {
	case *object:
		b.WriteByte('{')
		for i, k := range t.keys {
			if i > 0 {
				b.WriteByte(',')
			}
			writeJSON(b, k)
			b.WriteByte(':')
			writeJSON(b, t.vals[k])
		}
		b.WriteByte('}')
	case []any:
		b.WriteByte('[')
		for i, e := range t {
			if i > 0 {
				b.WriteByte(',')
			}
			writeJSON(b, e)
		}
		b.WriteByte(']')
	case json.Number:
		b.WriteString(t.String())
	default:
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(t)
		b.WriteString(strings.TrimSuffix(buf.String(), "\n"))
	}
}
