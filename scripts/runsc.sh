#!/usr/bin/env bash
# Builds gVisor's runsc at a pinned version from the Go module proxy into a
# cache dir and prints its path. Idempotent: a cached binary is reused.
#   RUNSC_VERSION  pseudo-version of gvisor.dev/gvisor (default: pinned below)
#   RUNSC_CACHE    cache root (default /var/cache/space/runsc)
# The binary lands in $RUNSC_CACHE/$RUNSC_VERSION/runsc; the server finds it
# with `space server --runsc PATH` (or on PATH).
set -euo pipefail
RUNSC_VERSION=${RUNSC_VERSION:-v0.0.0-20260905035102-160fafc42237}
RUNSC_CACHE=${RUNSC_CACHE:-/var/cache/space/runsc}
dir=$RUNSC_CACHE/$RUNSC_VERSION
bin=$dir/runsc
# The build's flavour: bump it when the way runsc is built changes, so that
# a cached binary of the old build is replaced.
flavour="$RUNSC_VERSION precompiled-seccomp"
if [ -x "$bin" ] && [ "$(cat "$dir/VERSION" 2>/dev/null)" = "$flavour" ] && "$bin" --version >/dev/null 2>&1; then
  echo "$bin"
  exit 0
fi
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  export PATH=$PATH:/usr/local/go/bin
fi
command -v go >/dev/null || { echo "runsc.sh: Go is required to build runsc" >&2; exit 1; }
mkdir -p "$dir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(
  cd "$work"
  go mod init runscbuild >/dev/null 2>&1
  go get "gvisor.dev/gvisor/runsc@$RUNSC_VERSION" >&2
  # gVisor's module source ships without the seccomp programs its own
  # (Bazel) build precompiles, so the Sentry and the gofer each compile and
  # optimise their host filter at every sandbox start (12 ms of runsc's
  # boot here). gvisor-precompile (below) asks gVisor's filter packages for
  # the programs and writes the two registration files the Bazel build
  # generates, into a copy of the module that the build then uses in place
  # of the module cache's (Go refuses build overlays there).
  mkdir -p gen
  cat > gen/main.go <<'GO'
// Command gvisor-precompile writes runsc's precompiled seccomp programs
// into a writable copy of gVisor's module: each filter package's
// filter_precompiled.go gets a registerPrograms that registers gVisor's
// programs.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"gvisor.dev/gvisor/pkg/seccomp/precompiledseccomp"
	bootconfig "gvisor.dev/gvisor/runsc/boot/filter/config"
	goferconfig "gvisor.dev/gvisor/runsc/fsgofer/filter/config"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: gvisor-precompile MODULE_COPY_DIR")
		os.Exit(2)
	}
	mod := os.Args[1]
	for _, f := range []struct {
		dir      string
		programs func() ([]precompiledseccomp.Program, error)
	}{
		{"runsc/boot/filter", bootconfig.PrecompiledPrograms},
		{"runsc/fsgofer/filter", goferconfig.PrecompiledPrograms},
	} {
		programs, err := f.programs()
		if err != nil {
			fail(fmt.Errorf("%s: %w", f.dir, err))
		}
		src := filepath.Join(mod, f.dir, "filter_precompiled.go")
		b, err := os.ReadFile(src)
		if err != nil {
			fail(err)
		}
		text := string(b)
		const off = "const PrecompilationDisabledAtBuildTime = true"
		const anchor = "programs := make(map[string]precompiledseccomp.Program)\n"
		if strings.Count(text, off) != 1 || strings.Count(text, anchor) != 1 {
			fail(fmt.Errorf("%s: not the file this generator knows (no %q or %q)", src, off, anchor))
		}
		// The bytecode goes into package-level arrays (static data, nothing
		// to build at start), registerPrograms only points at them: built
		// inside the function, the 576 programs cost 7 ms of each boot.
		var arrays, reg strings.Builder
		for i, p := range programs {
			fmt.Fprintf(&arrays, "var precompiledBytecode%d = [...]uint32{", i)
			for j, v := range p.Bytecode32 {
				if j%8 == 0 {
					arrays.WriteString("\n\t")
				}
				fmt.Fprintf(&arrays, "0x%08x, ", v)
			}
			arrays.WriteString("\n}\n\n")
			names := make([]string, 0, len(p.VarOffsets))
			for name := range p.VarOffsets {
				names = append(names, name)
			}
			sort.Strings(names)
			fmt.Fprintf(&reg, "\tprograms[%q] = precompiledseccomp.Program{Name: %q, Bytecode32: precompiledBytecode%d[:], VarOffsets: map[string][]int{", p.Name, p.Name, i)
			for _, name := range names {
				fmt.Fprintf(&reg, "%q: %#v, ", name, p.VarOffsets[name])
			}
			reg.WriteString("}}\n")
		}
		text = strings.Replace(text, off, "const PrecompilationDisabledAtBuildTime = false", 1)
		text = strings.Replace(text, anchor, anchor+reg.String(), 1)
		text += "\n" + arrays.String()
		if err := os.WriteFile(src, []byte(text), 0o644); err != nil {
			fail(err)
		}
		fmt.Fprintf(os.Stderr, "gvisor-precompile: %s: %d programs\n", f.dir, len(programs))
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "gvisor-precompile:", err)
	os.Exit(1)
}
GO
  CGO_ENABLED=0 go build -o "$work/gvisor-precompile" ./gen >&2
  cp -r "$(go list -m -f '{{.Dir}}' gvisor.dev/gvisor)" gvisor
  chmod -R u+w gvisor
  "$work/gvisor-precompile" gvisor
  go mod edit -replace gvisor.dev/gvisor=./gvisor
  CGO_ENABLED=0 go build -trimpath -o "$work/runsc" gvisor.dev/gvisor/runsc >&2
)
"$work/runsc" --version >/dev/null
install -m 0755 "$work/runsc" "$bin.tmp"
mv -f "$bin.tmp" "$bin"
echo "$flavour" > "$dir/VERSION"
echo "$bin"
