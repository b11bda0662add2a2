package httpx

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
)

// Request-size limits at the edge of both public listeners. Go's own
// limit (http.Server.MaxHeaderBytes) is set higher, to ServerMaxHeaderBytes,
// so that Limits answers with the JSON envelope and the right status; what
// is larger still is answered by Go, and Listener turns that answer into
// the envelope too.
const (
	MaxURIBytes          = 16 << 10  // the request target (path and query)
	MaxHeaderBytes       = 64 << 10  // every header line, as sent
	ServerMaxHeaderBytes = 256 << 10 // for http.Server.MaxHeaderBytes
)

// Limits answers 414 uri_too_long and 431 header_too_large, with the JSON
// envelope, for requests over MaxURIBytes and MaxHeaderBytes.
func Limits(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n := len(r.RequestURI); n > MaxURIBytes {
			w.Header().Set("Connection", "close")
			WriteError(w, Errorf(http.StatusRequestURITooLong, "uri_too_long",
				"request URI of %d bytes; at most %d", n, MaxURIBytes))
			return
		}
		n := len("Host: \r\n") + len(r.Host)
		for k, vs := range r.Header {
			for _, v := range vs {
				n += len(k) + len(v) + len(": \r\n")
			}
		}
		if n > MaxHeaderBytes {
			w.Header().Set("Connection", "close")
			WriteError(w, Errorf(http.StatusRequestHeaderFieldsTooLarge, "header_too_large",
				"request headers of %d bytes; at most %d", n, MaxHeaderBytes))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Listener wraps a public listener so that the plain-text answers net/http
// writes itself, before any handler runs (headers over MaxHeaderBytes, a
// malformed request), go out as the JSON error envelope instead.
func Listener(ln net.Listener) net.Listener { return edgeListener{ln} }

type edgeListener struct{ net.Listener }

func (l edgeListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &edgeConn{Conn: c}, nil
}

type edgeConn struct{ net.Conn }

// goErrorHeaders is what net/http puts between the status line and the
// body of the answers it writes on its own. Handler answers never have it:
// net/http writes their headers sorted, and with a Date.
const goErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

func (c *edgeConn) Write(p []byte) (int, error) {
	if out, ok := rewriteGoError(p); ok {
		if _, err := c.Conn.Write(out); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// CloseWrite keeps net/http's half-close after a 431 working.
func (c *edgeConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// ReadFrom keeps net/http's sendfile and splice paths for response bodies
// (net/http's own answers are written with Write).
func (c *edgeConn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}

// rewriteGoError turns one of net/http's own plain-text answers
// ("HTTP/1.1 431 Request Header Fields Too Large" + goErrorHeaders + text)
// into the same status with the JSON envelope.
func rewriteGoError(p []byte) ([]byte, bool) {
	const proto = "HTTP/1.1 "
	if !bytes.HasPrefix(p, []byte(proto)) {
		return nil, false
	}
	i := bytes.Index(p, []byte(goErrorHeaders))
	if i < 0 || bytes.IndexByte(p[:i], '\n') >= 0 {
		return nil, false
	}
	statusLine := string(p[len(proto):i])
	code, err := strconv.Atoi(strings.SplitN(statusLine, " ", 2)[0])
	if err != nil || code < 400 || code > 599 {
		return nil, false
	}
	errCode, msg := "malformed_request", strings.TrimSpace(string(p[i+len(goErrorHeaders):]))
	if code == http.StatusRequestHeaderFieldsTooLarge {
		errCode, msg = "header_too_large", fmt.Sprintf("request line and headers larger than %d bytes", MaxHeaderBytes)
	}
	body, _ := json.Marshal(map[string]any{"error": map[string]string{"code": errCode, "message": msg}})
	body = append(body, '\n')
	var b bytes.Buffer
	fmt.Fprintf(&b, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n",
		code, http.StatusText(code), len(body))
	b.Write(body)
	return b.Bytes(), true
}

// ContentTypes enforces the request media types an OpenAPI document gives
// its operations (requestBody.content), for the routes of mux:
//
//   - a request without a body, or to a route that documents no body, is
//     not checked;
//   - no Content-Type is read as JSON where the route takes application/json,
//     and as raw bytes where it takes application/octet-stream or */*;
//   - "*/*" takes any media type but multipart/*, which would store the
//     form's envelope as the bytes;
//   - otherwise the media type (parameters such as charset aside) must be
//     one the route lists.
//
// Anything else is 415 unsupported_media_type with the JSON envelope.
func ContentTypes(doc []byte, mux *http.ServeMux, next http.Handler) (http.Handler, error) {
	types, err := BodyTypes(doc)
	if err != nil {
		return nil, err
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 || len(r.TransferEncoding) > 0 {
			if _, pattern := mux.Handler(r); types[pattern] != nil {
				if err := CheckContentType(r.Header.Get("Content-Type"), types[pattern]); err != nil {
					WriteError(w, err)
					return
				}
			}
		}
		next.ServeHTTP(w, r)
	}), nil
}

// BodyTypes reads the request media types of every operation of an
// OpenAPI document, keyed "METHOD /path" like ServeMux patterns.
func BodyTypes(doc []byte) (map[string][]string, error) {
	var d struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(doc, &d); err != nil {
		return nil, fmt.Errorf("openapi: %w", err)
	}
	out := map[string][]string{}
	for path, ops := range d.Paths {
		for method, raw := range ops {
			var op struct {
				RequestBody *struct {
					Content map[string]json.RawMessage `json:"content"`
				} `json:"requestBody"`
			}
			if json.Unmarshal(raw, &op) != nil || op.RequestBody == nil {
				continue
			}
			var list []string
			for mt := range op.RequestBody.Content {
				list = append(list, strings.ToLower(mt))
			}
			sort.Strings(list)
			out[strings.ToUpper(method)+" "+path] = list
		}
	}
	return out, nil
}

// CheckContentType checks a request's Content-Type against the media
// types its route accepts (see ContentTypes).
func CheckContentType(header string, accepted []string) error {
	has := func(mt string) bool {
		for _, a := range accepted {
			if a == mt {
				return true
			}
		}
		return false
	}
	if strings.TrimSpace(header) == "" {
		if has("application/json") || has("application/octet-stream") || has("*/*") {
			return nil
		}
		return unsupported("no Content-Type", "", accepted)
	}
	mt, _, err := mime.ParseMediaType(header)
	if err != nil {
		return unsupported(fmt.Sprintf("Content-Type %.100q does not parse", header), "", accepted)
	}
	if has(mt) || has("*/*") && !strings.HasPrefix(mt, "multipart/") {
		return nil
	}
	return unsupported(fmt.Sprintf("Content-Type %.100q is not accepted", mt), mt, accepted)
}

func unsupported(what, got string, accepted []string) error {
	want := make([]string, 0, len(accepted))
	for _, a := range accepted {
		if a == "*/*" {
			a = "any media type but multipart (the body is taken as raw bytes)"
		}
		want = append(want, a)
	}
	hint := ""
	if got == "application/x-www-form-urlencoded" {
		suggest := accepted[0]
		for _, a := range accepted {
			if a == "application/json" || a == "application/octet-stream" {
				suggest = a
			}
		}
		hint = fmt.Sprintf(" (curl -d and --data-binary send application/x-www-form-urlencoded: add -H 'Content-Type: %s')", suggest)
	}
	return Errorf(http.StatusUnsupportedMediaType, "unsupported_media_type", "%s here; send %s%s",
		what, strings.Join(want, " or "), hint)
}
