package main

import (
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/space-sandbox/space/pkg/client"
)

// maxCLICode bounds code read from stdin: the data plane takes 512 KiB.
const maxCLICode = 512 << 10

// sandboxRunCode runs code in a code-interpreter-v1 sandbox's interpreter:
// stdout and stderr as they come, then the results (text; images saved
// with --save-images), the error's traceback on stderr and exit status 1
// when the code raised.
func sandboxRunCode(args []string) error {
	fs, cl := newClientFlags("sandbox run-code")
	lang := fs.String("language", "", "run in this language's default context: python (default), javascript, r, bash")
	ctxID := fs.String("context", "", "run in this context (an id from the E2B SDK's createCodeContext)")
	env := kvFlag{}
	fs.Var(env, "env", "environment variable K=V for this run only (repeatable)")
	timeout := durationVar(fs, "timeout", 0, "interrupt the run after this long, e.g. 30s (default: the server's, 5m)")
	images := fs.String("save-images", "", "write PNG, JPEG and SVG results into this directory")
	pos, err := parseClientArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) < 1 || len(pos) > 2 {
		return usagef("usage: space sandbox run-code [flags] ID [CODE | -]   (no CODE or -: read it from stdin)")
	}
	code := ""
	if len(pos) == 2 && pos[1] != "-" {
		code = pos[1]
	} else {
		b, err := io.ReadAll(io.LimitReader(os.Stdin, maxCLICode+1))
		if err != nil {
			return err
		}
		if len(b) > maxCLICode {
			return fmt.Errorf("code on stdin is over %d bytes", maxCLICode)
		}
		code = string(b)
	}
	api, ctx, stop, err := cl.connect()
	if err != nil {
		return err
	}
	defer stop()
	sc, err := api.Connect(ctx, pos[0])
	if err != nil {
		return err
	}
	req := client.CodeRequest{Code: code, Language: *lang, ContextID: *ctxID, EnvVars: env, Timeout: *timeout}
	var onEvent func(client.CodeEvent) error
	if !cl.json {
		onEvent = func(ev client.CodeEvent) error {
			switch ev.Type {
			case client.CodeEventStdout:
				_, err := io.WriteString(cl.out, ev.Text)
				return err
			case client.CodeEventStderr:
				_, err := io.WriteString(cl.errOut, ev.Text)
				return err
			}
			return nil
		}
	}
	ex, err := sc.RunCode(ctx, req, onEvent)
	if err != nil {
		return err
	}
	var saved []string
	if *images != "" {
		if saved, err = saveImages(*images, ex.Results); err != nil {
			return err
		}
	}
	if cl.json {
		if err := cl.printJSON(ex); err != nil {
			return err
		}
	} else {
		for _, r := range ex.Results {
			if r.Text != "" {
				fmt.Fprintln(cl.out, r.Text)
			} else {
				fmt.Fprintf(cl.out, "<result: %s>\n", strings.Join(resultFormats(r), ", "))
			}
		}
		for _, p := range saved {
			fmt.Fprintln(cl.errOut, "saved", p)
		}
		if ex.Error != nil {
			if ex.Error.Traceback != "" {
				fmt.Fprintln(cl.errOut, ex.Error.Traceback)
			}
			fmt.Fprintf(cl.errOut, "%s: %s\n", ex.Error.Name, ex.Error.Value)
		}
	}
	if ex.Error != nil {
		return exitCode(1)
	}
	return nil
}

// resultFormats names the formats a result came in.
func resultFormats(r client.CodeResult) []string {
	var out []string
	for name, v := range map[string]string{"html": r.HTML, "markdown": r.Markdown, "svg": r.SVG, "png": r.PNG,
		"jpeg": r.JPEG, "pdf": r.PDF, "latex": r.LaTeX, "javascript": r.JavaScript,
		"json": string(r.JSON), "data": string(r.Data), "chart": string(r.Chart)} {
		if v != "" {
			out = append(out, name)
		}
	}
	for k := range r.Extra {
		out = append(out, k)
	}
	if len(out) == 0 {
		out = append(out, "empty")
	}
	slices.Sort(out)
	return out
}

// saveImages writes the image results into dir as result-N.png|jpg|svg.
func saveImages(dir string, results []client.CodeResult) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var saved []string
	for i, r := range results {
		for _, img := range []struct {
			ext, data string
			b64       bool
		}{{"png", r.PNG, true}, {"jpg", r.JPEG, true}, {"svg", r.SVG, false}} {
			if img.data == "" {
				continue
			}
			b := []byte(img.data)
			if img.b64 {
				var err error
				if b, err = base64.StdEncoding.DecodeString(strings.TrimSpace(img.data)); err != nil {
					return saved, fmt.Errorf("result %d: %s is not base64: %w", i+1, img.ext, err)
				}
			}
			p := filepath.Join(dir, fmt.Sprintf("result-%d.%s", i+1, img.ext))
			if err := os.WriteFile(p, b, 0o644); err != nil {
				return saved, err
			}
			saved = append(saved, p)
		}
	}
	return saved, nil
}
