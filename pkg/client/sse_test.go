package client

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

type ev struct{ id, typ, data string }

func parseAll(r io.Reader, max int) ([]ev, time.Duration, error) {
	p := newSSEParser(r, max)
	var out []ev
	for {
		e, err := p.next()
		if err != nil {
			return out, p.Retry(), err
		}
		out = append(out, ev{e.ID, e.Type, string(e.Data)})
	}
}

func TestSSEParser(t *testing.T) {
	cases := []struct {
		name, in string
		want     []ev
		err      error
	}{
		{"lf", "id: 1\nevent: stdout\ndata: aGk=\n\n", []ev{{"1", "stdout", "aGk="}}, io.EOF},
		{"crlf", "id: 1\r\nevent: x\r\ndata: a\r\n\r\n", []ev{{"1", "x", "a"}}, io.EOF},
		{"lone cr", "id: 7\revent: x\rdata: a\r\r", []ev{{"7", "x", "a"}}, io.EOF},
		{"mixed endings", "data: a\r\ndata: b\rdata: c\n\r\n", []ev{{"", "message", "a\nb\nc"}}, io.EOF},
		{"multi-line data", "data: {\ndata: \"k\": 1\ndata: }\n\n", []ev{{"", "message", "{\n\"k\": 1\n}"}}, io.EOF},
		{"comments and keepalive", ": keep-alive\n\n: hi\ndata: x\n\n", []ev{{"", "message", "x"}}, io.EOF},
		{"no space after colon", "data:x\nevent:y\n\n", []ev{{"", "y", "x"}}, io.EOF},
		{"only one space stripped", "data:  x \n\n", []ev{{"", "message", " x "}}, io.EOF},
		{"field without colon", "data\n\n", []ev{{"", "message", ""}}, io.EOF},
		{"empty data dispatches", "data:\n\n", []ev{{"", "message", ""}}, io.EOF},
		{"no data no dispatch", "event: x\nid: 3\n\ndata: y\n\n", []ev{{"3", "message", "y"}}, io.EOF},
		{"id persists", "id: 4\ndata: a\n\ndata: b\n\nid:\ndata: c\n\n", []ev{{"4", "message", "a"}, {"4", "message", "b"}, {"", "message", "c"}}, io.EOF},
		{"id with NUL ignored", "id: 1\ndata: a\n\nid: 2\x003\ndata: b\n\n", []ev{{"1", "message", "a"}, {"1", "message", "b"}}, io.EOF},
		{"unknown field", "foo: bar\ndata: a\n\n", []ev{{"", "message", "a"}}, io.EOF},
		{"bom", "\xef\xbb\xbfdata: a\n\n", []ev{{"", "message", "a"}}, io.EOF},
		{"colon in value", "data: a:b: c\n\n", []ev{{"", "message", "a:b: c"}}, io.EOF},
		{"incomplete event at eof", "data: a\n\ndata: b\n", []ev{{"", "message", "a"}}, io.ErrUnexpectedEOF},
		{"unterminated line at eof", "data: a\n\ndata: b", []ev{{"", "message", "a"}}, io.ErrUnexpectedEOF},
		{"empty", "", nil, io.EOF},
		{"line too long", "data: " + strings.Repeat("x", 100) + "\n\n", nil, ErrEventTooLarge},
		{"event too large", strings.Repeat("data: xxxxxxxxxx\n", 10) + "\n", nil, ErrEventTooLarge},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, slow := range []bool{false, true} {
				var r io.Reader = strings.NewReader(tc.in)
				if slow {
					r = iotest.OneByteReader(r)
				}
				got, _, err := parseAll(r, 64)
				if !errors.Is(err, tc.err) {
					t.Fatalf("slow=%v: err = %v, want %v", slow, err, tc.err)
				}
				if len(got) != len(tc.want) {
					t.Fatalf("slow=%v: got %q, want %q", slow, got, tc.want)
				}
				for i := range got {
					if got[i] != tc.want[i] {
						t.Fatalf("slow=%v: event %d = %q, want %q", slow, i, got[i], tc.want[i])
					}
				}
			}
		})
	}
}

func TestSSEParserRetry(t *testing.T) {
	_, retry, _ := parseAll(strings.NewReader("retry: 1500\n\nretry: x\n\nretry: -1\n\n"), 0)
	if retry != 1500*time.Millisecond {
		t.Fatalf("retry = %v", retry)
	}
}

// A lone CR must end a line at once: waiting to see whether an LF follows
// would stall a live stream until the server's next write.
func TestSSEParserCRDoesNotBlock(t *testing.T) {
	pr, pw := io.Pipe()
	defer pw.Close()
	go pw.Write([]byte("data: a\r\r"))
	done := make(chan ev, 1)
	go func() {
		e, err := newSSEParser(pr, 0).next()
		if err == nil {
			done <- ev{e.ID, e.Type, string(e.Data)}
		}
		close(done)
	}()
	select {
	case e := <-done:
		if e.data != "a" {
			t.Fatalf("got %q", e)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("parser blocked after a lone CR")
	}
}

// refParse is a straightforward reading of the spec over a whole input, to
// check the streaming parser against.
func refParse(in []byte, max int) []ev {
	in = bytes.TrimPrefix(in, []byte("\xef\xbb\xbf"))
	var lines []string
	start := 0
	for i := 0; i < len(in); i++ {
		if in[i] == '\n' || in[i] == '\r' {
			lines = append(lines, string(in[start:i]))
			if in[i] == '\r' && i+1 < len(in) && in[i+1] == '\n' {
				i++
			}
			start = i + 1
		}
	}
	var out []ev
	var data, typ, id string
	hasData := false
	for _, l := range lines {
		if len(l) > max {
			return out
		}
		if l == "" {
			if hasData {
				t := typ
				if t == "" {
					t = "message"
				}
				out = append(out, ev{id, t, strings.TrimSuffix(data, "\n")})
			}
			data, typ, hasData = "", "", false
			continue
		}
		if l[0] == ':' {
			continue
		}
		f, v, found := strings.Cut(l, ":")
		if found {
			v = strings.TrimPrefix(v, " ")
		}
		switch f {
		case "data":
			if len(data)+len(v)+1 > max {
				return out
			}
			data += v + "\n"
			hasData = true
		case "event":
			typ = v
		case "id":
			if !strings.Contains(v, "\x00") {
				id = v
			}
		}
	}
	return out
}

func FuzzSSEParser(f *testing.F) {
	for _, s := range []string{
		"id: 1\nevent: stdout\ndata: aGk=\n\n",
		"data: a\r\ndata: b\rdata: c\n\r\n",
		": keep-alive\n\nid: 2\nevent: exit\ndata: {\"exit_code\":0}\n\n",
		"\xef\xbb\xbfdata\n\nretry: 10\nid: \x00\n\n",
		"data: x\r",
		"event: operation.updated\ndata: {}\n\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		const max = 256
		want := refParse(in, max)
		for _, slow := range []bool{false, true} {
			var r io.Reader = bytes.NewReader(in)
			if slow {
				r = iotest.OneByteReader(r)
			}
			got, _, err := parseAll(r, max)
			if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, ErrEventTooLarge) {
				t.Fatalf("unexpected error %v", err)
			}
			// After a size error the parser stops; what it delivered must
			// still be a prefix of the reference.
			if !errors.Is(err, ErrEventTooLarge) && len(got) != len(want) {
				t.Fatalf("slow=%v: got %d events %q, reference %d %q", slow, len(got), got, len(want), want)
			}
			if len(got) > len(want) {
				t.Fatalf("slow=%v: got %d events, reference only %d", slow, len(got), len(want))
			}
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("slow=%v: event %d = %q, reference %q", slow, i, got[i], want[i])
				}
			}
		}
	})
}
