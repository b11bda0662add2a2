package template

import (
	"encoding/json"
	"fmt"
	"path"
	"strings"
	"unicode/utf8"
)

// A build file is a documented subset of a Dockerfile (docs/templates.md):
//
//	FROM <template name | registry image reference>   exactly once, first
//	RUN <shell command> | RUN ["argv0", "arg", ...]
//	COPY <src>... <dest>  | COPY ["src", ..., "dest"]   sources from the build context
//	ENV K=V [K2=V2 ...]   | ENV K V
//	WORKDIR /abs/or/relative
//	USER name-or-uid
//	START <shell command> | START ["argv0", ...]       the template's start command
//	READY <shell command> | READY ["argv0", ...]       its ready check
//
// Lines starting with # are comments; a line ending in \ continues on the
// next one. Everything else (ARG, ADD, multi-stage builds, flags such as
// --chown) is refused rather than silently ignored.

// Instruction kinds.
const (
	InstrFrom    = "FROM"
	InstrRun     = "RUN"
	InstrCopy    = "COPY"
	InstrEnv     = "ENV"
	InstrWorkdir = "WORKDIR"
	InstrUser    = "USER"
	InstrStart   = "START"
	InstrReady   = "READY"
)

// Bounds on a build file: it comes from API clients.
const (
	MaxBuildfileBytes = 256 << 10
	maxInstructions   = 256
	maxLineBytes      = 64 << 10
	maxArgs           = 1024
)

// Instruction is one parsed build-file step.
type Instruction struct {
	Kind string `json:"kind"`
	// Line is the 1-based line number where the instruction starts.
	Line int `json:"line"`
	// Text is the instruction as written (continuations joined), for
	// progress and logs.
	Text string `json:"text"`

	From  string      `json:"from,omitempty"`  // FROM
	Shell string      `json:"shell,omitempty"` // RUN/START/READY shell form
	Argv  []string    `json:"argv,omitempty"`  // RUN/START/READY exec form
	Srcs  []string    `json:"srcs,omitempty"`  // COPY sources (clean, relative to the context)
	Dest  string      `json:"dest,omitempty"`  // COPY destination as written
	Env   [][2]string `json:"env,omitempty"`   // ENV pairs in order
	Dir   string      `json:"dir,omitempty"`   // WORKDIR
	User  string      `json:"user,omitempty"`  // USER
}

// Buildfile is a parsed build file.
type Buildfile struct {
	From  string
	Steps []Instruction // every instruction after FROM, in order
}

// ParseBuildfile parses and validates a build file. Errors wrap ErrInvalid
// and name the line.
func ParseBuildfile(src []byte) (*Buildfile, error) {
	if len(src) > MaxBuildfileBytes {
		return nil, fmt.Errorf("%w: build file larger than %d bytes", ErrInvalid, MaxBuildfileBytes)
	}
	if !utf8.Valid(src) || strings.ContainsRune(string(src), 0) {
		return nil, fmt.Errorf("%w: build file is not UTF-8 text", ErrInvalid)
	}
	lines := strings.Split(strings.ReplaceAll(string(src), "\r\n", "\n"), "\n")
	bf := &Buildfile{}
	for i := 0; i < len(lines); i++ {
		start := i + 1
		line := strings.TrimSpace(lines[i])
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		// Continuations: a trailing backslash joins the next line;
		// comment lines inside a continuation are skipped (as Docker does).
		for strings.HasSuffix(line, `\`) && i+1 < len(lines) {
			line = strings.TrimSuffix(line, `\`)
			i++
			next := strings.TrimSpace(lines[i])
			if strings.HasPrefix(next, "#") {
				line += `\` // still continued
				continue
			}
			line += " " + next
			if len(line) > maxLineBytes {
				return nil, fmt.Errorf("%w: line %d: instruction longer than %d bytes", ErrInvalid, start, maxLineBytes)
			}
		}
		line = strings.TrimSpace(strings.TrimSuffix(line, `\`))
		if line == "" {
			continue
		}
		in, err := parseInstruction(line, start)
		if err != nil {
			return nil, err
		}
		if in.Kind == InstrFrom {
			if bf.From != "" || len(bf.Steps) > 0 {
				return nil, fmt.Errorf("%w: line %d: FROM must come first and only once (multi-stage builds are not supported)", ErrInvalid, start)
			}
			bf.From = in.From
			continue
		}
		if bf.From == "" {
			return nil, fmt.Errorf("%w: line %d: the first instruction must be FROM", ErrInvalid, start)
		}
		if len(bf.Steps) >= maxInstructions {
			return nil, fmt.Errorf("%w: more than %d instructions", ErrInvalid, maxInstructions)
		}
		bf.Steps = append(bf.Steps, in)
	}
	if bf.From == "" {
		return nil, fmt.Errorf("%w: build file has no FROM", ErrInvalid)
	}
	return bf, nil
}

func parseInstruction(line string, n int) (Instruction, error) {
	kw, rest, _ := strings.Cut(line, " ")
	if i := strings.IndexAny(kw, "\t"); i >= 0 {
		kw, rest = kw[:i], kw[i+1:]+" "+rest
	}
	rest = strings.TrimSpace(rest)
	in := Instruction{Kind: strings.ToUpper(kw), Line: n, Text: line}
	bad := func(format string, args ...any) (Instruction, error) {
		return Instruction{}, fmt.Errorf("%w: line %d: %s: %s", ErrInvalid, n, in.Kind, fmt.Sprintf(format, args...))
	}
	if rest == "" {
		return bad("needs an argument")
	}
	switch in.Kind {
	case InstrFrom:
		if strings.ContainsAny(rest, " \t") {
			return bad("takes one template name or image reference (no AS, no --platform)")
		}
		if len(rest) > 512 {
			return bad("reference longer than 512 bytes")
		}
		in.From = rest
	case InstrRun, InstrStart, InstrReady:
		argv, isExec, err := execForm(rest)
		if err != nil {
			return bad("%v", err)
		}
		if isExec {
			in.Argv = argv
		} else {
			if strings.HasPrefix(rest, "--") {
				return bad("flags (%s) are not supported", strings.Fields(rest)[0])
			}
			in.Shell = rest
		}
	case InstrCopy:
		args, isExec, err := execForm(rest)
		if err != nil {
			return bad("%v", err)
		}
		if !isExec {
			args = strings.Fields(rest)
		}
		if len(args) > 0 && strings.HasPrefix(args[0], "--") {
			return bad("flags (%s) are not supported", args[0])
		}
		if len(args) < 2 {
			return bad("needs at least one source and a destination")
		}
		for _, s := range args[:len(args)-1] {
			c, err := contextPath(s)
			if err != nil {
				return bad("%v", err)
			}
			in.Srcs = append(in.Srcs, c)
		}
		in.Dest = args[len(args)-1]
		if strings.ContainsRune(in.Dest, 0) || len(in.Dest) > 4096 {
			return bad("bad destination")
		}
	case InstrEnv:
		pairs, err := parseEnv(rest)
		if err != nil {
			return bad("%v", err)
		}
		in.Env = pairs
	case InstrWorkdir:
		if len(rest) > 4096 {
			return bad("path longer than 4096 bytes")
		}
		in.Dir = rest
	case InstrUser:
		if strings.ContainsAny(rest, " \t:") || len(rest) > 256 {
			return bad("takes one user name or uid (no group)")
		}
		in.User = rest
	case "ADD", "ARG", "CMD", "ENTRYPOINT", "EXPOSE", "LABEL", "VOLUME", "HEALTHCHECK", "ONBUILD", "SHELL", "STOPSIGNAL", "MAINTAINER":
		return bad("not supported in SPACE build files (see docs/templates.md)")
	default:
		return bad("unknown instruction")
	}
	return in, nil
}

// execForm parses a JSON array form (["a","b"]); isExec is false when s is
// not one (then it is the shell form).
func execForm(s string) ([]string, bool, error) {
	if !strings.HasPrefix(s, "[") {
		return nil, false, nil
	}
	var argv []string
	if err := json.Unmarshal([]byte(s), &argv); err != nil {
		return nil, false, fmt.Errorf("exec form is not a JSON array of strings: %v", err)
	}
	if len(argv) == 0 || len(argv) > maxArgs {
		return nil, false, fmt.Errorf("exec form needs 1..%d strings", maxArgs)
	}
	for _, a := range argv {
		if strings.ContainsRune(a, 0) {
			return nil, false, fmt.Errorf("NUL in argument")
		}
	}
	return argv, true, nil
}

// contextPath cleans a COPY source: relative to the context root and never
// leaving it. Globs are not supported.
func contextPath(s string) (string, error) {
	if s == "" || strings.ContainsRune(s, 0) || len(s) > 4096 {
		return "", fmt.Errorf("bad source %q", s)
	}
	if strings.ContainsAny(s, "*?[") {
		return "", fmt.Errorf("source %q: wildcards are not supported", s)
	}
	c := path.Clean("/" + s)
	for _, part := range strings.Split(s, "/") {
		if part == ".." {
			return "", fmt.Errorf("source %q leaves the build context", s)
		}
	}
	c = strings.TrimPrefix(c, "/")
	if c == "" {
		c = "."
	}
	return c, nil
}

// parseEnv reads "K=V K2=V2" (values may be double-quoted, with \" and \\
// escapes) or the legacy "K V" form.
func parseEnv(s string) ([][2]string, error) {
	if k, v, ok := strings.Cut(s, " "); ok && !strings.Contains(k, "=") {
		if err := checkEnvKey(k); err != nil {
			return nil, err
		}
		return [][2]string{{k, strings.TrimSpace(v)}}, nil
	}
	var out [][2]string
	for s = strings.TrimSpace(s); s != ""; s = strings.TrimSpace(s) {
		eq := strings.IndexByte(s, '=')
		if eq <= 0 {
			return nil, fmt.Errorf("want K=V, got %.40q", s)
		}
		k := s[:eq]
		if err := checkEnvKey(k); err != nil {
			return nil, err
		}
		s = s[eq+1:]
		var v strings.Builder
		if strings.HasPrefix(s, `"`) {
			i := 1
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) {
					i++
				}
				v.WriteByte(s[i])
			}
			if i >= len(s) {
				return nil, fmt.Errorf("unterminated quote in value of %s", k)
			}
			s = s[i+1:]
			if s != "" && s[0] != ' ' && s[0] != '\t' {
				return nil, fmt.Errorf("text after the closing quote of %s", k)
			}
		} else {
			end := strings.IndexAny(s, " \t")
			if end < 0 {
				end = len(s)
			}
			v.WriteString(s[:end])
			s = s[end:]
		}
		out = append(out, [2]string{k, v.String()})
	}
	return out, nil
}

func checkEnvKey(k string) error {
	if k == "" || len(k) > 256 || strings.ContainsAny(k, "= \t\x00\"'") {
		return fmt.Errorf("bad variable name %.40q", k)
	}
	return nil
}

// applyConfig returns cfg after a config instruction (ENV, WORKDIR, USER,
// START, READY). WORKDIR is relative to the current one, as in Dockerfiles.
func applyConfig(cfg Defaults, in Instruction) Defaults {
	switch in.Kind {
	case InstrEnv:
		env := make(map[string]string, len(cfg.Env)+len(in.Env))
		for k, v := range cfg.Env {
			env[k] = v
		}
		for _, kv := range in.Env {
			env[kv[0]] = expandEnv(kv[1], env)
		}
		cfg.Env = env
	case InstrWorkdir:
		d := expandEnv(in.Dir, cfg.Env)
		if !path.IsAbs(d) {
			base := cfg.Cwd
			if base == "" {
				base = "/"
			}
			d = path.Join(base, d)
		}
		cfg.Cwd = path.Clean(d)
	case InstrUser:
		cfg.User = expandEnv(in.User, cfg.Env)
	case InstrStart:
		cfg.Cmd = commandOf(in)
	case InstrReady:
		cfg.Ready = commandOf(in)
	}
	return cfg
}

func commandOf(in Instruction) []string {
	if in.Argv != nil {
		return append([]string(nil), in.Argv...)
	}
	return []string{"/bin/sh", "-c", in.Shell}
}

// expandEnv substitutes $VAR and ${VAR} from env (unset: empty), as
// Dockerfiles do for ENV, WORKDIR and USER. \$ is a literal dollar.
func expandEnv(s string, env map[string]string) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '\\' && i+1 < len(s) && s[i+1] == '$' {
			b.WriteByte('$')
			i++
			continue
		}
		if c != '$' || i+1 == len(s) {
			b.WriteByte(c)
			continue
		}
		j := i + 1
		var name string
		if s[j] == '{' {
			end := strings.IndexByte(s[j:], '}')
			if end < 0 {
				b.WriteString(s[i:])
				break
			}
			name = s[j+1 : j+end]
			i = j + end
		} else {
			k := j
			for k < len(s) && (s[k] == '_' || s[k] >= 'a' && s[k] <= 'z' || s[k] >= 'A' && s[k] <= 'Z' || s[k] >= '0' && s[k] <= '9') {
				k++
			}
			if k == j {
				b.WriteByte(c)
				continue
			}
			name = s[j:k]
			i = k - 1
		}
		b.WriteString(env[name])
	}
	return b.String()
}
