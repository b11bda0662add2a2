package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/space-sandbox/space/test/testenv"
)

// fakeInterpreter answers every /execute on port 49999 with the same
// events (a stand-in for code-interpreter-v1's server in the busybox
// template: busybox nc runs it per connection).
const fakeInterpreter = `n=0
cr=$(printf '\r')
while IFS= read -r l; do
  l=${l%"$cr"}
  case "$l" in [Cc]ontent-[Ll]ength:*) n=${l#*:}; n=${n# };; "") break;; esac
done
head -c "$n" >/dev/null
printf 'HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nConnection: close\r\n\r\n'
cat /tmp/events.ndjson
`

// checkCode runs code from the code tab: the page gets the data plane's
// POST /code stream and shows stdout, a PNG, a table from a result's data
// and a table from its HTML, with the HTML's scripts and attributes gone.
func checkCode(t *testing.T, b *browser, srv *testenv.Server, key, id, shots string) {
	const png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
	events := []map[string]any{
		{"type": "number_of_executions", "execution_count": 1},
		{"type": "stdout", "text": "hello from the interpreter\n"},
		{"type": "result", "is_main_result": false, "png": png},
		{"type": "result", "is_main_result": false, "text": "df", "data": map[string]any{"a": []int{1, 2}, "b": []string{"x", "y"}}},
		{"type": "result", "is_main_result": true, "text": "t", "html": `<table><tr><th>k</th></tr><tr><td onclick="window.__pwned=1" id="evil">v</td></tr></table><script>window.__pwned=1</script><img src=x onerror="window.__pwned=1">`},
		{"type": "end_of_execution"},
	}
	var nd bytes.Buffer
	for _, ev := range events {
		json.NewEncoder(&nd).Encode(ev)
	}
	st, sess, err := testenv.DoJSON("POST", srv.Ctrl+"/v1/sandboxes/"+id+"/session", map[string]string{"X-API-Key": key}, nil)
	if err != nil || st != 200 {
		t.Fatalf("session: %d %v", st, err)
	}
	base, tok := fmt.Sprint(sess["data_url"])+"/v1/sandboxes/"+id, "Bearer "+fmt.Sprint(sess["token"])
	call := func(method, path, ctype string, body []byte, want int) {
		req, _ := http.NewRequest(method, base+path, bytes.NewReader(body))
		req.Header.Set("Authorization", tok)
		req.Header.Set("Content-Type", ctype)
		resp, err := testenv.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, raw)
		}
	}
	// Nothing listens yet: the route says so.
	call("POST", "/code", "application/json", []byte(`{"code":"1"}`), http.StatusConflict)
	call("PUT", "/files?path=/tmp/events.ndjson", "application/octet-stream", nd.Bytes(), http.StatusNoContent)
	call("PUT", "/files?path=/tmp/fake.sh", "application/octet-stream", []byte(fakeInterpreter), http.StatusNoContent)
	call("POST", "/commands", "application/json",
		[]byte(`{"argv":["/bin/busybox","nc","-ll","-p","49999","-e","/bin/busybox","sh","/tmp/fake.sh"]}`), http.StatusCreated)
	if st, _, err := testenv.DoJSON("GET", base+"/ports?wait=49999", map[string]string{"Authorization": tok}, nil); err != nil || st != 200 {
		t.Fatalf("port 49999: %d %v", st, err)
	}

	b.eval(fmt.Sprintf(`location.hash = "#/sandbox/%s/code"`, id), nil)
	b.waitFor(t, "the code tab", `document.querySelector("#code-input")`, 10*time.Second)
	// Every language of the interpreter (docs/code-interpreter.md).
	var langs string
	b.eval(`Array.from(document.querySelectorAll("#code-language option")).map((o) => o.value).join(",")`, &langs)
	if langs != "python,javascript,typescript,r,bash" {
		t.Errorf("code tab languages %q", langs)
	}
	b.eval(`document.querySelector("#code-input").value = "print('hello')"; document.querySelector("#code-run").click()`, nil)
	b.waitFor(t, "the run's output", `/done in/.test(document.querySelector("#code-status").textContent)`, 15*time.Second)
	var got struct {
		Stdout, TD, HTMLTD string
		PNG, Rows, Attrs   int
		Pwned, Count       any
	}
	b.eval(`(() => {
	  const o = document.querySelector("#code-output");
	  const html = o.querySelector(".result-html");
	  return {
	    Stdout: o.querySelector(".log .stdout") ? o.querySelector(".log .stdout").textContent : "",
	    PNG: o.querySelectorAll('img[src^="data:image/png;base64,"]').length,
	    Rows: o.querySelectorAll("table.result-table tbody tr").length,
	    TD: o.querySelector("table.result-table tbody td") ? o.querySelector("table.result-table tbody td").textContent : "",
	    HTMLTD: html && html.querySelector("td") ? html.querySelector("td").textContent : "",
	    Attrs: html ? Array.from(html.querySelectorAll("*")).reduce((n, e) => n + e.attributes.length - (e.tagName === "TABLE" ? 1 : 0), 0) + html.querySelectorAll("script,img").length : -1,
	    Pwned: window.__pwned || null,
	    Count: o.querySelector(".cell").dataset.count,
	  };
	})()`, &got)
	if got.Stdout != "hello from the interpreter\n" || got.PNG != 1 || got.TD != "1" || got.HTMLTD != "v" || got.Attrs != 0 || got.Pwned != nil || got.Count != "1" {
		t.Errorf("code tab: %+v", got)
	}
	// Rows: 2 of the data table, 1 of the HTML table (its header row has no tbody of its own).
	if got.Rows < 2 {
		t.Errorf("code tab: %d table rows", got.Rows)
	}
	b.screenshot(t, filepath.Join(shots, "code.png"))
}
