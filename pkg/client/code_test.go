package client

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A fake of the data plane's code route: the request it gets and the
// events it sends.
func TestRunCodeCollectsEvents(t *testing.T) {
	e := newEnv(t)
	var got map[string]any
	e.mux.HandleFunc("POST /v1/sandboxes/sbx-0123456789abcdef/code", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok" {
			writeErr(w, 401, "unauthorized", "no token")
			return
		}
		json.NewDecoder(r.Body).Decode(&got)
		sseStart(w)
		io.WriteString(w, ": keepalive\n\n")
		sseEventOut(w, "", "number_of_executions", `{"type":"number_of_executions","execution_count":3}`)
		sseEventOut(w, "", "stdout", `{"type":"stdout","text":"hi\n","timestamp":"t"}`)
		sseEventOut(w, "", "result", `{"type":"result","is_main_result":false,"png":"iVBO","extra":{"x/y":1}}`)
		sseEventOut(w, "", "result", `{"type":"result","is_main_result":true,"text":"2","data":{"a":[1]}}`)
		sseEventOut(w, "", "error", `{"type":"error","name":"ZeroDivisionError","value":"division by zero","traceback":"tb"}`)
		sseEventOut(w, "", "end_of_execution", `{"type":"end_of_execution"}`)
	})
	var types []string
	ex, err := e.conn().RunCode(context.Background(), CodeRequest{Code: "1+1", Language: "python", EnvVars: map[string]string{"A": "b"}, Timeout: 1500 * time.Millisecond},
		func(ev CodeEvent) error { types = append(types, ev.Type); return nil })
	if err != nil {
		t.Fatal(err)
	}
	if got["code"] != "1+1" || got["language"] != "python" || got["timeout_ms"] != 1500.0 || got["env_vars"].(map[string]any)["A"] != "b" || got["context_id"] != nil {
		t.Errorf("request body %v", got)
	}
	if strings.Join(types, ",") != "number_of_executions,stdout,result,result,error,end_of_execution" {
		t.Errorf("events %v", types)
	}
	if ex.Text() != "2" || ex.ExecutionCount != 3 || len(ex.Stdout) != 1 || ex.Stdout[0] != "hi\n" || len(ex.Results) != 2 {
		t.Errorf("execution %+v", ex)
	}
	if ex.Results[0].PNG != "iVBO" || string(ex.Results[0].Extra["x/y"]) != "1" || string(ex.Results[1].Data) != `{"a":[1]}` {
		t.Errorf("results %+v", ex.Results)
	}
	if ex.Error == nil || ex.Error.Name != "ZeroDivisionError" || ex.Error.Error() != "ZeroDivisionError: division by zero" {
		t.Errorf("error %+v", ex.Error)
	}
}

func TestRunCodeErrors(t *testing.T) {
	e := newEnv(t)
	e.mux.HandleFunc("POST /v1/sandboxes/sbx-0123456789abcdef/code", func(w http.ResponseWriter, r *http.Request) {
		var req map[string]any
		json.NewDecoder(r.Body).Decode(&req)
		switch req["code"] {
		case "refused":
			writeErr(w, 409, "no_interpreter", "nothing listens on port 49999")
		case "cut":
			sseStart(w)
			sseEventOut(w, "", "stdout", `{"type":"stdout","text":"partial"}`)
		case "stop":
			sseStart(w)
			sseEventOut(w, "", "stdout", `{"type":"stdout","text":"one"}`)
			sseEventOut(w, "", "end_of_execution", `{"type":"end_of_execution"}`)
		}
	})
	c := e.conn()
	_, err := c.RunCode(context.Background(), CodeRequest{Code: "refused"}, nil)
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != 409 || ae.Code != "no_interpreter" {
		t.Errorf("refused: %v", err)
	}
	ex, err := c.RunCode(context.Background(), CodeRequest{Code: "cut"}, nil)
	if err == nil || !errors.Is(err, io.ErrUnexpectedEOF) || len(ex.Stdout) != 1 {
		t.Errorf("cut: %v %+v", err, ex)
	}
	stop := errors.New("enough")
	if _, err := c.RunCode(context.Background(), CodeRequest{Code: "stop"}, func(CodeEvent) error { return stop }); !errors.Is(err, stop) {
		t.Errorf("callback error: %v", err)
	}
}
