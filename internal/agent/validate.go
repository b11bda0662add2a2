package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// errInvalid marks a request the agent refuses as malformed (HTTP 400).
var errInvalid = errors.New("invalid request")

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errInvalid, fmt.Sprintf(format, args...))
}

// defaultPath is PATH for commands whose environment does not set one.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// maxTimeoutMs (a year) keeps the deadline arithmetic far from overflow.
const maxTimeoutMs = 365 * 24 * 3600 * 1000

// cleanPath validates a sandbox path from a request and returns it cleaned.
// It must be absolute, at most MaxPathBytes, free of NUL and of ".."
// elements: the agent's "/" is the sandbox root, so ".." could not escape,
// but a caller that sends it is confused or probing and gets a 400.
func cleanPath(p string) (string, error) {
	switch {
	case p == "":
		return "", invalidf("empty path")
	case len(p) > MaxPathBytes:
		return "", invalidf("path longer than %d bytes", MaxPathBytes)
	case strings.IndexByte(p, 0) >= 0:
		return "", invalidf("path contains NUL")
	case p[0] != '/':
		return "", invalidf("path must be absolute")
	}
	for _, elem := range strings.Split(p, "/") {
		if elem == ".." {
			return "", invalidf("path must not contain '..'")
		}
	}
	return path.Clean(p), nil
}

// decodeJSON decodes exactly one JSON value into v, rejecting unknown fields
// and trailing data. The caller bounds r.
func decodeJSON(r io.Reader, v any) error {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return err
		}
		return invalidf("bad JSON body: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return err
		}
		return invalidf("bad JSON body: trailing data")
	}
	return nil
}

// decodeProcessSpec parses and validates a ProcessSpec body.
func decodeProcessSpec(data []byte) (ProcessSpec, error) {
	var spec ProcessSpec
	if err := decodeJSON(bytes.NewReader(data), &spec); err != nil {
		return ProcessSpec{}, err
	}
	if err := validateSpec(&spec); err != nil {
		return ProcessSpec{}, err
	}
	return spec, nil
}

func validateSpec(spec *ProcessSpec) error {
	if (len(spec.Argv) == 0) == (spec.Shell == "") {
		return invalidf("exactly one of argv and shell must be set")
	}
	if len(spec.Argv) > MaxArgs {
		return invalidf("more than %d arguments", MaxArgs)
	}
	if len(spec.Env) > MaxArgs {
		return invalidf("more than %d environment variables", MaxArgs)
	}
	total := len(spec.Shell)
	for _, a := range spec.Argv {
		total += len(a) + 1
		if strings.IndexByte(a, 0) >= 0 {
			return invalidf("argument contains NUL")
		}
	}
	if len(spec.Argv) > 0 && spec.Argv[0] == "" {
		return invalidf("empty program name")
	}
	if strings.IndexByte(spec.Shell, 0) >= 0 {
		return invalidf("shell command contains NUL")
	}
	n, err := checkEnv(spec.Env)
	if err != nil {
		return err
	}
	total += n
	if total > MaxArgBytes {
		return invalidf("argv and env exceed %d bytes", MaxArgBytes)
	}
	if spec.Cwd != "" {
		c, err := cleanPath(spec.Cwd)
		if err != nil {
			return invalidf("cwd: %v", err)
		}
		spec.Cwd = c
	}
	if spec.User != "" && (len(spec.User) > maxUserName || strings.ContainsAny(spec.User, ":\n\x00")) {
		return invalidf("invalid user")
	}
	if spec.TimeoutMs < 0 || spec.TimeoutMs > maxTimeoutMs {
		return invalidf("timeout_ms out of range [0, %d]", maxTimeoutMs)
	}
	if len(spec.Tag) > 1024 {
		return invalidf("tag longer than 1024 bytes")
	}
	if spec.PTY != nil && (spec.PTY.Cols == 0 || spec.PTY.Rows == 0) {
		return invalidf("pty size must be non-zero")
	}
	return nil
}

func validateConfig(cfg *Config) error {
	if len(cfg.Env) > MaxArgs {
		return invalidf("more than %d environment variables", MaxArgs)
	}
	n, err := checkEnv(cfg.Env)
	if err != nil {
		return err
	}
	if n > MaxArgBytes {
		return invalidf("env exceeds %d bytes", MaxArgBytes)
	}
	if cfg.Cwd != "" {
		c, err := cleanPath(cfg.Cwd)
		if err != nil {
			return invalidf("cwd: %v", err)
		}
		cfg.Cwd = c
	}
	if cfg.User != "" && (len(cfg.User) > maxUserName || strings.ContainsAny(cfg.User, ":\n\x00")) {
		return invalidf("invalid user")
	}
	return nil
}

// checkEnv validates names and values and returns their size as "k=v\0".
func checkEnv(env map[string]string) (int, error) {
	total := 0
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return 0, invalidf("invalid environment variable name %q", truncate(k, 64))
		}
		if strings.IndexByte(v, 0) >= 0 {
			return 0, invalidf("environment variable %q contains NUL", truncate(k, 64))
		}
		total += len(k) + len(v) + 2
	}
	return total, nil
}

// buildEnv merges the defaults, the config's env and the spec's env (later
// wins) into a sorted "k=v" list.
func buildEnv(acct account, pty bool, layers ...map[string]string) []string {
	m := map[string]string{
		"PATH":    defaultPath,
		"HOME":    acct.Home,
		"USER":    acct.Name,
		"LOGNAME": acct.Name,
	}
	if pty {
		m["TERM"] = "xterm-256color"
	}
	for _, l := range layers {
		for k, v := range l {
			m[k] = v
		}
	}
	env := make([]string, 0, len(m))
	for k, v := range m {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	return env
}

// parseSignal accepts "SIGTERM", "TERM", "15" as a JSON string, or 15 as a
// JSON number. Signal 0 is refused: it is a probe, not a signal.
func parseSignal(raw json.RawMessage) (syscall.Signal, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return 0, invalidf("missing signal")
	}
	var s string
	if raw[0] == '"' {
		if err := json.Unmarshal(raw, &s); err != nil {
			return 0, invalidf("bad signal: %v", err)
		}
	} else {
		s = string(raw)
	}
	if len(s) > 32 {
		return 0, invalidf("bad signal")
	}
	if n, err := strconv.Atoi(s); err == nil {
		if n < 1 || n > 64 {
			return 0, invalidf("signal number out of range")
		}
		return syscall.Signal(n), nil
	}
	name := strings.ToUpper(s)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if sig := unix.SignalNum(name); sig != 0 {
		return sig, nil
	}
	return 0, invalidf("unknown signal %q", truncate(s, 32))
}

// signalName names a signal like "SIGKILL", or "SIG<n>" for unnamed ones.
func signalName(sig syscall.Signal) string {
	if n := unix.SignalName(sig); n != "" {
		return n
	}
	return "SIG" + strconv.Itoa(int(sig))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
