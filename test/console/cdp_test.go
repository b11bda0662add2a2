package console

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// browser is headless Chromium driven over the Chrome DevTools Protocol
// on --remote-debugging-pipe (fd 3: commands in, fd 4: answers and events
// out, NUL-separated JSON): the same protocol as the websocket, without a
// port to find or a websocket client to carry.
type browser struct {
	cmd     *exec.Cmd
	in      io.WriteCloser
	mu      sync.Mutex
	next    int
	pending map[int]chan cdpMsg
	onEvent func(cdpMsg)
	session string // the page's flat session
}

type cdpMsg struct {
	ID        int             `json:"id,omitempty"`
	Method    string          `json:"method,omitempty"`
	Params    json.RawMessage `json:"params,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	SessionID string          `json:"sessionId,omitempty"`
	Error     *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error,omitempty"`
}

func startBrowser(t *testing.T, bin string, onEvent func(cdpMsg)) *browser {
	t.Helper()
	cmdR, cmdW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	profile := t.TempDir()
	cmd := exec.Command(bin, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
		"--disable-sync", "--disable-component-update", "--mute-audio", "--hide-scrollbars",
		"--remote-debugging-pipe", "--user-data-dir="+profile, "--window-size=1280,860", "about:blank")
	cmd.ExtraFiles = []*os.File{cmdR, outW}
	cmd.Stderr = &tail{max: 16 << 10}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	cmdR.Close()
	outW.Close()
	b := &browser{cmd: cmd, in: cmdW, pending: map[int]chan cdpMsg{}, onEvent: onEvent}
	go b.read(outR)
	t.Cleanup(func() {
		b.call("", "Browser.close", nil, nil)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("chromium stderr (tail):\n%s", cmd.Stderr.(*tail).String())
		}
	})
	// One page, attached in flat mode: its commands carry its sessionId.
	var tg struct {
		TargetID string `json:"targetId"`
	}
	if err := b.call("", "Target.createTarget", map[string]any{"url": "about:blank"}, &tg); err != nil {
		t.Fatalf("createTarget: %v (stderr: %s)", err, cmd.Stderr.(*tail).String())
	}
	var at struct {
		SessionID string `json:"sessionId"`
	}
	if err := b.call("", "Target.attachToTarget", map[string]any{"targetId": tg.TargetID, "flatten": true}, &at); err != nil {
		t.Fatal(err)
	}
	b.session = at.SessionID
	for _, m := range []string{"Page.enable", "Runtime.enable", "Log.enable"} {
		if err := b.page(m, nil, nil); err != nil {
			t.Fatal(m, err)
		}
	}
	if err := b.page("Emulation.setDeviceMetricsOverride", map[string]any{"width": 1280, "height": 860, "deviceScaleFactor": 1, "mobile": false}, nil); err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *browser) read(r io.Reader) {
	br := bufio.NewReaderSize(r, 1<<20)
	for {
		raw, err := br.ReadBytes(0)
		if err != nil {
			b.mu.Lock()
			for id, ch := range b.pending {
				close(ch)
				delete(b.pending, id)
			}
			b.mu.Unlock()
			return
		}
		var m cdpMsg
		if json.Unmarshal(raw[:len(raw)-1], &m) != nil {
			continue
		}
		if m.ID == 0 {
			if b.onEvent != nil {
				b.onEvent(m)
			}
			continue
		}
		b.mu.Lock()
		ch := b.pending[m.ID]
		delete(b.pending, m.ID)
		b.mu.Unlock()
		if ch != nil {
			ch <- m
		}
	}
}

// call sends one command (session "" = the browser) and decodes its result.
func (b *browser) call(session, method string, params, result any) error {
	b.mu.Lock()
	b.next++
	id := b.next
	ch := make(chan cdpMsg, 1)
	b.pending[id] = ch
	b.mu.Unlock()
	p, _ := json.Marshal(params)
	if params == nil {
		p = []byte("{}")
	}
	msg, _ := json.Marshal(map[string]any{"id": id, "method": method, "params": json.RawMessage(p), "sessionId": session})
	if session == "" {
		msg, _ = json.Marshal(map[string]any{"id": id, "method": method, "params": json.RawMessage(p)})
	}
	if _, err := b.in.Write(append(msg, 0)); err != nil {
		return err
	}
	select {
	case m, ok := <-ch:
		if !ok {
			return fmt.Errorf("%s: browser gone", method)
		}
		if m.Error != nil {
			return fmt.Errorf("%s: %s", method, m.Error.Message)
		}
		if result != nil {
			return json.Unmarshal(m.Result, result)
		}
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("%s: no answer in 30 s", method)
	}
}

func (b *browser) page(method string, params, result any) error {
	return b.call(b.session, method, params, result)
}

// eval runs an expression in the page (promises awaited) and decodes its value.
func (b *browser) eval(expr string, out any) error {
	var r struct {
		Result struct {
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		ExceptionDetails *struct {
			Text      string `json:"text"`
			Exception struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	if err := b.page("Runtime.evaluate", map[string]any{"expression": expr, "awaitPromise": true, "returnByValue": true}, &r); err != nil {
		return err
	}
	if r.ExceptionDetails != nil {
		return fmt.Errorf("%s: %s", r.ExceptionDetails.Text, r.ExceptionDetails.Exception.Description)
	}
	if out != nil && len(r.Result.Value) > 0 {
		return json.Unmarshal(r.Result.Value, out)
	}
	return nil
}

// waitFor polls a JS expression until it is truthy.
func (b *browser) waitFor(t *testing.T, what, expr string, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var last error
	for ctx.Err() == nil {
		var ok bool
		if last = b.eval("!!("+expr+")", &ok); last == nil && ok {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	var body string
	b.eval("document.body ? document.body.innerText.slice(0, 3000) : ''", &body)
	t.Fatalf("waiting for %s (%s): timed out after %v (last error: %v); page text:\n%s", what, expr, d, last, body)
}

func (b *browser) screenshot(t *testing.T, path string) {
	t.Helper()
	var r struct {
		Data string `json:"data"`
	}
	if err := b.page("Page.captureScreenshot", map[string]any{"format": "png"}, &r); err != nil {
		t.Fatal(err)
	}
	raw, err := base64.StdEncoding.DecodeString(r.Data)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
}

// setFiles puts local files into an <input type=file> (what a user's
// file picker does) and fires its change event.
func (b *browser) setFiles(t *testing.T, selector string, files ...string) {
	t.Helper()
	var doc struct {
		Root struct {
			NodeID int `json:"nodeId"`
		} `json:"root"`
	}
	if err := b.page("DOM.getDocument", map[string]any{"depth": 0}, &doc); err != nil {
		t.Fatal(err)
	}
	var q struct {
		NodeID int `json:"nodeId"`
	}
	if err := b.page("DOM.querySelector", map[string]any{"nodeId": doc.Root.NodeID, "selector": selector}, &q); err != nil || q.NodeID == 0 {
		t.Fatalf("querySelector %s: %v (node %d)", selector, err, q.NodeID)
	}
	if err := b.page("DOM.setFileInputFiles", map[string]any{"nodeId": q.NodeID, "files": files}, nil); err != nil {
		t.Fatal(err)
	}
}

// typeText types into the focused element as a keyboard would: text as
// input, then Enter as a key press.
func (b *browser) typeText(t *testing.T, text string) {
	t.Helper()
	for _, line := range strings.SplitAfter(text, "\n") {
		s := strings.TrimSuffix(line, "\n")
		if s != "" {
			if err := b.page("Input.insertText", map[string]any{"text": s}, nil); err != nil {
				t.Fatal(err)
			}
		}
		if strings.HasSuffix(line, "\n") {
			for _, typ := range []string{"keyDown", "keyUp"} {
				ev := map[string]any{"type": typ, "key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13, "nativeVirtualKeyCode": 13}
				if typ == "keyDown" {
					ev["text"] = "\r"
				}
				if err := b.page("Input.dispatchKeyEvent", ev, nil); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// tail keeps the last max bytes written to it.
type tail struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (w *tail) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	if len(w.buf) > w.max {
		w.buf = w.buf[len(w.buf)-w.max:]
	}
	return len(p), nil
}

func (w *tail) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.buf)
}
