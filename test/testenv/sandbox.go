package testenv

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// Sandbox is a running sandbox and its session, as the tests use it.
type Sandbox struct {
	ID, Token, Data string
}

// WaitOp long-polls an operation until it ends (or d passes) and returns it.
func (s *Server) WaitOp(key, id string, d time.Duration) (map[string]any, error) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		st, m, err := DoJSON("GET", s.Ctrl+"/v1/operations/"+id+"?wait=30s", map[string]string{"X-API-Key": key}, nil)
		if err != nil || st != 200 {
			return m, fmt.Errorf("get operation %s: %d %v %v", id, st, m, err)
		}
		if st := m["state"]; st == "succeeded" || st == "failed" || st == "cancelled" {
			return m, nil
		}
	}
	return nil, fmt.Errorf("operation %s not done after %v", id, d)
}

// CreateSandbox creates a sandbox with req (template "minimal" unless it
// names one) and waits until it runs.
func (s *Server) CreateSandbox(key string, req map[string]any) (Sandbox, error) {
	if req == nil {
		req = map[string]any{}
	}
	if _, ok := req["template"]; !ok {
		req["template"] = "minimal"
	}
	st, m, err := DoJSON("POST", s.Ctrl+"/v1/sandboxes", map[string]string{"X-API-Key": key}, req)
	if err != nil || st != 202 {
		return Sandbox{}, fmt.Errorf("create: %d %v %v", st, m, err)
	}
	sess := m["session"].(map[string]any)
	sb := Sandbox{ID: m["sandbox"].(map[string]any)["id"].(string), Token: sess["token"].(string), Data: sess["data_url"].(string)}
	op, err := s.WaitOp(key, m["operation"].(map[string]any)["id"].(string), 2*time.Minute)
	if err != nil {
		return sb, err
	}
	if op["state"] != "succeeded" {
		return sb, fmt.Errorf("create %s: %v", sb.ID, op)
	}
	return sb, nil
}

// Run runs a shell script as user ("" = the sandbox's default user) and
// returns its stdout and exit code once it exits.
func (sb Sandbox) Run(script, user string) (string, int, error) {
	auth := map[string]string{"Authorization": "Bearer " + sb.Token}
	spec := map[string]any{"shell": script}
	if user != "" {
		spec["user"] = user
	}
	st, m, err := DoJSON("POST", sb.Data+"/v1/sandboxes/"+sb.ID+"/commands", auth, spec)
	if err != nil || st != 201 {
		return "", -1, fmt.Errorf("start command: %d %v %v", st, m, err)
	}
	req, _ := http.NewRequest("GET", sb.Data+"/v1/sandboxes/"+sb.ID+"/commands/"+m["id"].(string)+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+sb.Token)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := HTTP.Do(req)
	if err != nil {
		return "", -1, err
	}
	defer resp.Body.Close()
	var out strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	ev := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			ev = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: ") && ev == "stdout":
			var b []byte
			_ = json.Unmarshal([]byte(`"`+strings.TrimPrefix(line, "data: ")+`"`), &b)
			out.Write(b)
		case strings.HasPrefix(line, "data: ") && ev == "exit":
			var ex struct {
				Code int `json:"exit_code"`
			}
			_ = json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ex)
			return out.String(), ex.Code, nil
		}
	}
	return out.String(), -1, fmt.Errorf("stream ended without exit: %v", sc.Err())
}

// Upload copies a local file into the sandbox at path (mode 0755) through
// its data plane.
func (sb Sandbox) Upload(path, local string) error {
	f, err := os.Open(local)
	if err != nil {
		return err
	}
	defer f.Close()
	req, err := http.NewRequest("PUT", sb.Data+"/v1/sandboxes/"+sb.ID+"/files?path="+url.QueryEscape(path)+"&mode=0755", f)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+sb.Token)
	resp, err := HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("upload to %s: %w", sb.ID, err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("upload to %s: HTTP %d", sb.ID, resp.StatusCode)
	}
	return nil
}
