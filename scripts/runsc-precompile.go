//go:build ignore

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
