package integration

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// postStream starts a command with Accept: accept and returns the answer.
func postStream(t *testing.T, sb *sandbox, accept, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", sb.Data+"/v1/sandboxes/"+sb.ID+"/commands", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+sb.Token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", accept)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// A POST of a command that asks for a stream gets its events on the same
// answer: 201, a "start" event with the command's view, then the output
// and the exit, which a GET of the events replays.
func TestStartAndStream(t *testing.T) {
	e := need(t)
	sb := e.create(t, nil)
	defer sb.delete(t)

	t.Run("sse", func(t *testing.T) {
		resp := postStream(t, sb, "text/event-stream", `{"shell":"echo hi; echo err >&2; exit 3","user":"root"}`)
		if resp.StatusCode != 201 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("answer %d %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
		}
		var start map[string]any
		var out, errb strings.Builder
		_, ex := readSSE(t, resp.Body, 0, func(ev event) {
			switch ev.Type {
			case "start":
				if start != nil {
					t.Errorf("a second start event")
				}
				if err := json.Unmarshal(ev.Data, &start); err != nil {
					t.Fatalf("start event %q: %v", ev.Data, err)
				}
			case "stdout":
				if start == nil {
					t.Errorf("output before the start event")
				}
				out.Write(ev.Data)
			case "stderr":
				errb.Write(ev.Data)
			}
		})
		if ex == nil || ex.Code != 3 || out.String() != "hi\n" || errb.String() != "err\n" {
			t.Fatalf("exit %+v, stdout %q, stderr %q", ex, out.String(), errb.String())
		}
		cid, _ := start["id"].(string)
		if cid == "" || resp.Header.Get("Location") != "/v1/sandboxes/"+sb.ID+"/commands/"+cid {
			t.Fatalf("start %v, Location %q", start, resp.Header.Get("Location"))
		}
		// The start event is the command's view when the stream began:
		// running, or, for a command this short, possibly ended already
		// (CI saw it), and then with the exit the stream carries.
		if start["running"] != true {
			if x, _ := start["exit"].(map[string]any); start["running"] != false || x == nil || x["exit_code"] != float64(3) {
				t.Fatalf("start %v: neither running nor ended with code 3", start)
			}
		}
		// The command is recorded like any other: its events replay.
		var again strings.Builder
		if _, ex := sb.stream(t, cid, "", 0, func(ev event) {
			if ev.Type == "stdout" {
				again.Write(ev.Data)
			}
		}); ex == nil || ex.Code != 3 || again.String() != "hi\n" {
			t.Fatalf("replay: exit %+v, stdout %q", ex, again.String())
		}
	})

	t.Run("frames", func(t *testing.T) {
		resp := postStream(t, sb, "application/x-space-events", `{"argv":["seq","1","3"]}`)
		if resp.StatusCode != 201 || resp.Header.Get("Content-Type") != "application/x-space-events" {
			t.Fatalf("answer %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		br := bufio.NewReader(resp.Body)
		var hdr [13]byte
		var out []byte
		var types []byte
		for {
			if _, err := io.ReadFull(br, hdr[:]); err != nil {
				t.Fatalf("frames ended after types %v: %v", types, err)
			}
			data := make([]byte, binary.BigEndian.Uint32(hdr[9:13]))
			if _, err := io.ReadFull(br, data); err != nil {
				t.Fatal(err)
			}
			types = append(types, hdr[8])
			if len(types) == 1 {
				var v map[string]any
				if hdr[8] != 5 || binary.BigEndian.Uint64(hdr[0:8]) != 0 || json.Unmarshal(data, &v) != nil || v["id"] == "" {
					t.Fatalf("first frame: type %d, seq %d, %q", hdr[8], binary.BigEndian.Uint64(hdr[0:8]), data)
				}
				continue
			}
			if hdr[8] == 1 {
				out = append(out, data...)
			}
			if hdr[8] == 3 {
				break
			}
		}
		if string(out) != "1\n2\n3\n" {
			t.Fatalf("stdout %q (frame types %v)", out, types)
		}
	})

	// A command that cannot start answers the JSON error, not a stream.
	t.Run("refused", func(t *testing.T) {
		resp := postStream(t, sb, "text/event-stream", `{"argv":["true"],"cwd":"/nonexistent"}`)
		var body struct {
			Error struct{ Code string } `json:"error"`
		}
		if resp.StatusCode != 400 || json.NewDecoder(resp.Body).Decode(&body) != nil || body.Error.Code == "" {
			t.Fatalf("answer %d %q %+v", resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
	})

	// Without a stream asked for, the answer is the JSON view, as before.
	t.Run("json", func(t *testing.T) {
		resp := postStream(t, sb, "application/json", `{"argv":["true"]}`)
		var v map[string]any
		if resp.StatusCode != 201 || json.NewDecoder(resp.Body).Decode(&v) != nil || v["id"] == "" || resp.Header.Get("Location") == "" {
			t.Fatalf("answer %d %v %q", resp.StatusCode, v, resp.Header.Get("Location"))
		}
	})
}
