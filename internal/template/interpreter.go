package template

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
)

// BuiltinCodeInterpreter is the template of E2B's code interpreter SDKs
// (their default template name): Debian with Python's Jupyter stack and
// Node.js, plus SPACE's interpreter server (interp/) on port 49999 as its
// start command.
const BuiltinCodeInterpreter = "code-interpreter-v1"

// InterpreterPort is where the interpreter server listens in the sandbox.
const InterpreterPort = 49999

//go:embed interp/server.py interp/jsctx.js interp/kernel_init.py
var interpFS embed.FS

// interpDir is where the server's files lie in the template.
const interpDir = "opt/space/interpreter"

// interpreterPackages are the Debian packages of code-interpreter-v1.
var interpreterPackages = []string{
	"python3", "ca-certificates", "python3-ipykernel", "python3-jupyter-client",
	"python3-numpy", "python3-pandas", "python3-matplotlib", "nodejs",
	// TypeScript contexts transpile each cell with it (67 MB, no new
	// dependencies beyond nodejs).
	"node-typescript",
	// R's Jupyter kernel; Debian installs its kernelspec ("ir").
	"r-base-core", "r-cran-irkernel",
}

// File is a file a Debian template gets on top of its packages (owned by
// root). Its path and contents are part of the digest.
type File struct {
	Path string      // relative, clean, e.g. "opt/space/x.py"
	Mode fs.FileMode // permission bits
	Data []byte
}

// Bounds on a request's files: they come from code, but stay bounded.
const (
	maxFiles     = 64
	maxFileBytes = 4 << 20
)

func interpreterFiles() ([]File, error) {
	var files []File
	for _, name := range []string{"server.py", "jsctx.js", "kernel_init.py"} {
		b, err := interpFS.ReadFile("interp/" + name)
		if err != nil {
			return nil, fmt.Errorf("template: interpreter file %s: %w", name, err)
		}
		files = append(files, File{Path: interpDir + "/" + name, Mode: 0o644, Data: b})
	}
	return files, nil
}

func interpreterRequest() (BuildRequest, error) {
	files, err := interpreterFiles()
	if err != nil {
		return BuildRequest{}, err
	}
	health := fmt.Sprintf("http://127.0.0.1:%d/health", InterpreterPort)
	return BuildRequest{
		Name:     BuiltinCodeInterpreter,
		Source:   SourceDebian,
		Suite:    defaultSuite,
		Packages: interpreterPackages,
		Files:    files,
		// Recommends (python3-tk and the like) are not needed. The tree
		// is still ~1.5 GB: matplotlib's fonttools depends on scipy and
		// sympy, and scipy's pythran on g++ and the boost headers.
		NoRecommends: true,
		Defaults: Defaults{
			Env:   map[string]string{"PATH": defaultPath, "LANG": "C.UTF-8"},
			Cwd:   "/home/user",
			User:  "user",
			Cmd:   []string{"python3", "/" + interpDir + "/server.py"},
			Ready: []string{"python3", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('" + health + "', timeout=5).status != 200)"},
		},
	}, nil
}

// filesDigest hashes files (paths, modes, contents) in path order for the
// recipe; it also validates them.
func filesDigest(files []File) (string, error) {
	if len(files) == 0 {
		return "", nil
	}
	if len(files) > maxFiles {
		return "", fmt.Errorf("%w: more than %d files", ErrInvalid, maxFiles)
	}
	sorted := slices.Clone(files)
	slices.SortFunc(sorted, func(a, b File) int { return strings.Compare(a.Path, b.Path) })
	h := sha256.New()
	for i, f := range sorted {
		if f.Path == "" || path.Clean(f.Path) != f.Path || path.IsAbs(f.Path) || f.Path == "." || strings.HasPrefix(f.Path, "../") || f.Path == ".." {
			return "", fmt.Errorf("%w: file path %q", ErrInvalid, f.Path)
		}
		if i > 0 && sorted[i-1].Path == f.Path {
			return "", fmt.Errorf("%w: file %q given twice", ErrInvalid, f.Path)
		}
		if len(f.Data) > maxFileBytes || f.Mode&^fs.ModePerm != 0 {
			return "", fmt.Errorf("%w: file %q: over %d bytes or not a plain mode", ErrInvalid, f.Path, maxFileBytes)
		}
		sum := sha256.Sum256(f.Data)
		fmt.Fprintf(h, "%q %o %x\n", f.Path, f.Mode, sum)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// writeFiles adds files to a Debian tree (still owned by host root, not
// yet shifted), creating parent directories (0755) as needed. Writes go
// through os.Root: the tree's symlinks are never followed out of it.
func writeFiles(rootPath string, files []File) error {
	if len(files) == 0 {
		return nil
	}
	root, err := os.OpenRoot(rootPath)
	if err != nil {
		return fmt.Errorf("template: files: %w", err)
	}
	defer root.Close()
	for _, f := range files {
		if dir := path.Dir(f.Path); dir != "." {
			if err := root.MkdirAll(dir, 0o755); err != nil {
				return fmt.Errorf("template: files: %w", err)
			}
		}
		if err := root.Remove(f.Path); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("template: files: %w", err)
		}
		if err := root.WriteFile(f.Path, f.Data, f.Mode); err != nil {
			return fmt.Errorf("template: files: %w", err)
		}
		if err := root.Chmod(f.Path, f.Mode); err != nil {
			return fmt.Errorf("template: files: %w", err)
		}
	}
	return nil
}
