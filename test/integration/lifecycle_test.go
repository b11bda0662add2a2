package integration

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestQuickstart(t *testing.T) {
	e := need(t)
	if !wantBase() {
		t.Skip("needs the Debian 'base' template (python3); set SPACE_TEST_BASE=1 (CI does)")
	}
	if err := e.waitTemplate("base", 15*time.Minute); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("python3", filepath.Join(repoRoot(), "examples", "quickstart.py"))
	cmd.Env = append(os.Environ(), "SPACE_URL="+e.Ctrl, "SPACE_API_KEY="+e.key)
	out, err := cmd.CombinedOutput()
	t.Logf("quickstart output:\n%s", out)
	if err != nil {
		t.Fatalf("quickstart failed: %v", err)
	}
	if !bytes.Contains(out, []byte("42")) {
		t.Fatal("quickstart did not print 42")
	}
}

func TestConcurrentSandboxes(t *testing.T) {
	e := need(t)
	const n = 20
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			sb := e.create(t, map[string]any{"metadata": map[string]string{"test": "concurrent"}})
			out, ex := sb.sh(t, fmt.Sprintf("echo sandbox-%d", i))
			if ex.Code != 0 || strings.TrimSpace(out) != fmt.Sprintf("sandbox-%d", i) {
				errs <- fmt.Errorf("sandbox %d: exit %d out %q", i, ex.Code, out)
			}
			sb.delete(t)
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	st, m, _ := e.call("GET", "/v1/sandboxes?metadata.test=concurrent", e.key, nil)
	if st != 200 || len(m["sandboxes"].([]any)) != 0 {
		t.Fatalf("deleted sandboxes still listed: %d %v", st, m)
	}
}

// seqText is what `seq 1 n` prints.
func seqText(n int) []byte {
	var b bytes.Buffer
	for i := 1; i <= n; i++ {
		b.WriteString(strconv.Itoa(i))
		b.WriteByte('\n')
	}
	return b.Bytes()
}

func TestLargeStdoutInOrder(t *testing.T) {
	e := need(t)
	sb := e.create(t, nil)
	defer sb.delete(t)
	const n = 6_700_000 // ≈ 52.5 MB of text
	want := seqText(n)
	if len(want) < 50<<20 {
		t.Fatalf("test data only %d bytes", len(want))
	}
	start := time.Now()
	out, _, ex := sb.run(t, map[string]any{"argv": []string{"seq", "1", strconv.Itoa(n)}})
	el := time.Since(start)
	if ex.Code != 0 {
		t.Fatalf("exit %+v", ex)
	}
	if len(out) != len(want) || sha256.Sum256([]byte(out)) != sha256.Sum256(want) {
		t.Fatalf("got %d bytes, want %d (content differs)", len(out), len(want))
	}
	t.Logf("%d MB over SSE in %v (%.0f MB/s)", len(want)>>20, el, float64(len(want))/1e6/el.Seconds())
}

func TestResumeWithLastEventID(t *testing.T) {
	e := need(t)
	sb := e.create(t, nil)
	defer sb.delete(t)
	const n = 2_000_000 // ≈ 14.8 MB
	want := seqText(n)
	cid := sb.start(t, map[string]any{"argv": []string{"seq", "1", strconv.Itoa(n)}})
	var got bytes.Buffer
	collect := func(ev event) { got.Write(ev.Data) }
	last, ex := sb.stream(t, cid, "", len(want)/2, collect)
	if ex != nil || last == "" {
		t.Fatalf("first half: last=%q exit=%v", last, ex)
	}
	half := got.Len()
	last2, ex := sb.stream(t, cid, last, 0, collect)
	if ex == nil || ex.Code != 0 {
		t.Fatalf("resume: exit %+v (last %s)", ex, last2)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("after resume at %d bytes: got %d bytes, want %d (duplicated or missing data)", half, got.Len(), len(want))
	}
}

func TestStdinRoundTrip(t *testing.T) {
	e := need(t)
	sb := e.create(t, nil)
	defer sb.delete(t)
	cid := sb.start(t, map[string]any{"argv": []string{"cat"}, "stdin": true})
	for _, chunk := range []string{"hello ", "from ", "stdin\n"} {
		if st, m, err := doRaw(sb, "POST", "/commands/"+cid+"/stdin", chunk); err != nil || st != 204 {
			t.Fatalf("stdin: %d %v %v", st, m, err)
		}
	}
	if st, m, _ := sb.dp("POST", "/commands/"+cid+"/stdin/close", nil); st != 204 {
		t.Fatalf("close stdin: %d %v", st, m)
	}
	var out bytes.Buffer
	_, ex := sb.stream(t, cid, "", 0, func(ev event) { out.Write(ev.Data) })
	if ex == nil || ex.Code != 0 || out.String() != "hello from stdin\n" {
		t.Fatalf("cat: exit %+v out %q", ex, out.String())
	}
}

func doRaw(sb *sandbox, method, path, body string) (int, map[string]any, error) {
	return doJSON(method, sb.Data+"/v1/sandboxes/"+sb.ID+path, map[string]string{"Authorization": "Bearer " + sb.Token}, []byte(body))
}

func TestSignalsExitCodesTimeout(t *testing.T) {
	e := need(t)
	sb := e.create(t, nil)
	defer sb.delete(t)
	_, ex := sb.sh(t, "exit 7")
	if ex.Code != 7 || ex.Signal != "" {
		t.Fatalf("exit 7: %+v", ex)
	}
	cid := sb.start(t, map[string]any{"argv": []string{"sleep", "100"}})
	time.Sleep(100 * time.Millisecond)
	if st, m, _ := sb.dp("POST", "/commands/"+cid+"/signal", map[string]any{"signal": "SIGTERM"}); st != 204 {
		t.Fatalf("signal: %d %v", st, m)
	}
	_, x := sb.stream(t, cid, "", 0, nil)
	if x == nil || x.Signal != "SIGTERM" || x.Code != -1 {
		t.Fatalf("after SIGTERM: %+v", x)
	}
	start := time.Now()
	_, _, tx := sb.run(t, map[string]any{"argv": []string{"sleep", "30"}, "timeout_ms": 300})
	if !tx.TimedOut || tx.Signal != "SIGKILL" || time.Since(start) > 10*time.Second {
		t.Fatalf("timeout: %+v after %v", tx, time.Since(start))
	}
	// A command keeps running while no client is connected.
	cid = sb.start(t, map[string]any{"shell": "sleep 0.5; echo survived"})
	time.Sleep(time.Second)
	var out bytes.Buffer
	_, x = sb.stream(t, cid, "", 0, func(ev event) { out.Write(ev.Data) })
	if x == nil || x.Code != 0 || out.String() != "survived\n" {
		t.Fatalf("detached command: %+v %q", x, out.String())
	}
	// Several commands at once, listed.
	a := sb.start(t, map[string]any{"argv": []string{"sleep", "1"}})
	b := sb.start(t, map[string]any{"argv": []string{"sleep", "1"}})
	st, m, _ := sb.dp("GET", "/commands", nil)
	if st != 200 {
		t.Fatalf("list commands: %d", st)
	}
	ids := map[string]bool{}
	for _, c := range m["commands"].([]any) {
		ids[c.(map[string]any)["id"].(string)] = true
	}
	if !ids[a] || !ids[b] {
		t.Fatalf("list misses running commands: %v", ids)
	}
}

func TestPTYResize(t *testing.T) {
	e := need(t)
	sb := e.create(t, nil)
	defer sb.delete(t)
	cid := sb.start(t, map[string]any{"shell": "stty size; read line; stty size", "stdin": true, "pty": map[string]any{"cols": 80, "rows": 24}})
	var out bytes.Buffer
	done := make(chan *exitInfo, 1)
	go func() {
		_, x := sb.stream(t, cid, "", 0, func(ev event) { out.Write(ev.Data) })
		done <- x
	}()
	time.Sleep(300 * time.Millisecond)
	if st, m, _ := sb.dp("POST", "/commands/"+cid+"/resize", map[string]any{"cols": 100, "rows": 40}); st != 204 {
		t.Fatalf("resize: %d %v", st, m)
	}
	doRaw(sb, "POST", "/commands/"+cid+"/stdin", "\n")
	select {
	case x := <-done:
		if x == nil || x.Code != 0 {
			t.Fatalf("pty command: %+v", x)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("pty command did not finish")
	}
	s := strings.ReplaceAll(out.String(), "\r", "")
	if !strings.Contains(s, "24 80") || !strings.Contains(s, "40 100") {
		t.Fatalf("stty output %q lacks 24 80 then 40 100", s)
	}
}

func TestFiles(t *testing.T) {
	e := need(t)
	sb := e.create(t, nil)
	defer sb.delete(t)
	payload := bytes.Repeat([]byte("0123456789abcdef"), 2<<20) // 32 MiB
	// Files act as the sandbox's default user ("user" in minimal): in its home.
	if st, m, err := doRaw(sb, "PUT", "/files?path=/home/user/big.bin", string(payload)); err != nil || st != 204 {
		t.Fatalf("upload: %d %v %v", st, m, err)
	}
	req, _ := newReq(sb, "GET", "/files?path=/home/user/big.bin")
	resp, err := httpc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	got.ReadFrom(resp.Body)
	resp.Body.Close()
	if !bytes.Equal(got.Bytes(), payload) {
		t.Fatalf("download: %d bytes, want %d", got.Len(), len(payload))
	}
	if st, _, _ := sb.dp("POST", "/files/mkdir", map[string]any{"path": "/home/user/work/a/b"}); st != 204 {
		t.Fatalf("mkdir: %d", st)
	}
	if st, _, _ := sb.dp("POST", "/files/move", map[string]any{"from": "/home/user/big.bin", "to": "/home/user/work/a/b/moved.bin"}); st != 204 {
		t.Fatalf("move: %d", st)
	}
	st, m, _ := sb.dp("GET", "/files/stat?path=/home/user/work/a/b/moved.bin", nil)
	if st != 200 || m["size"].(float64) != float64(len(payload)) || m["type"] != "file" {
		t.Fatalf("stat: %d %v", st, m)
	}
	st, m, _ = sb.dp("GET", "/files/list?path=/home/user/work/a/b", nil)
	if st != 200 || len(m["entries"].([]any)) != 1 {
		t.Fatalf("list: %d %v", st, m)
	}
	if st, _, _ := sb.dp("DELETE", "/files?path=/home/user/work/a&recursive=true", nil); st != 204 {
		t.Fatalf("remove: %d", st)
	}
	if st, _, _ := sb.dp("GET", "/files/stat?path=/home/user/work/a", nil); st != 404 {
		t.Fatalf("stat after remove: %d", st)
	}
	// The file written through the API is the one commands see.
	doRaw(sb, "PUT", "/files?path=/tmp/x.txt", "via-api")
	if out, _ := sb.sh(t, "cat /tmp/x.txt"); out != "via-api" {
		t.Fatalf("command sees %q", out)
	}
}

// framesFrom reads a command's events as binary frames (Accept:
// application/x-space-events) after lastID; it returns stdout and the exit.
func framesFrom(t *testing.T, sb *sandbox, cid, lastID string, stopAfter int) (out []byte, last uint64, exit *exitInfo) {
	t.Helper()
	req, _ := http.NewRequest("GET", sb.Data+"/v1/sandboxes/"+sb.ID+"/commands/"+cid+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+sb.Token)
	req.Header.Set("Accept", "application/x-space-events")
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("frames: %v %v", resp, err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "application/x-space-events" {
		t.Fatalf("frames content type %q", ct)
	}
	br := bufio.NewReaderSize(resp.Body, 1<<20)
	var hdr [13]byte
	for {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return out, last, nil
		}
		seq := binary.BigEndian.Uint64(hdr[0:8])
		if last != 0 && seq != last+1 {
			t.Fatalf("frame seq %d after %d", seq, last)
		}
		last = seq
		data := make([]byte, binary.BigEndian.Uint32(hdr[9:13]))
		if _, err := io.ReadFull(br, data); err != nil {
			t.Fatalf("frame body: %v", err)
		}
		switch hdr[8] {
		case 1:
			out = append(out, data...)
		case 3:
			var x exitInfo
			if err := json.Unmarshal(data, &x); err != nil {
				t.Fatalf("exit frame: %v", err)
			}
			return out, last, &x
		}
		if stopAfter > 0 && len(out) >= stopAfter {
			return out, last, nil
		}
	}
}

// The binary frame stream carries the same events as SSE without base64,
// in order, and resumes after a Last-Event-ID like SSE.
func TestFrameStream(t *testing.T) {
	e := need(t)
	sb := e.create(t, nil)
	defer sb.delete(t)
	const n = 2_000_000
	want := seqText(n)
	cid := sb.start(t, map[string]any{"argv": []string{"seq", "1", strconv.Itoa(n)}})
	first, last, x := framesFrom(t, sb, cid, "", len(want)/2)
	if x != nil || last == 0 {
		t.Fatalf("first half: last %d exit %v", last, x)
	}
	rest, _, x := framesFrom(t, sb, cid, strconv.FormatUint(last, 10), 0)
	if x == nil || x.Code != 0 {
		t.Fatalf("resume: exit %+v", x)
	}
	if got := append(first, rest...); !bytes.Equal(got, want) {
		t.Fatalf("frames: got %d bytes, want %d (order or duplicates wrong)", len(got), len(want))
	}
}
