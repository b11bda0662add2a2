// Package threadstatus reads the kernel's view of every thread of the
// calling process (/proc/self/task/<tid>/status), so that security state
// set per thread (capability sets, no_new_privs, seccomp) can be checked on
// all of them after it was changed.
package threadstatus

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Each calls fn with the fields of the status file of every thread of the
// process ("CapBnd" → "000001ffffffffff", "Seccomp" → "2", ...). A thread
// that ends meanwhile is skipped; finding no thread at all is an error.
func Each(fn func(tid string, status map[string]string) error) error {
	tasks, err := filepath.Glob("/proc/self/task/*/status")
	if err != nil || len(tasks) == 0 {
		return fmt.Errorf("threadstatus: list /proc/self/task: %d threads, %v", len(tasks), err)
	}
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("threadstatus: %w", err)
		}
		st := map[string]string{}
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok {
				st[k] = strings.TrimSpace(v)
			}
		}
		if err := fn(filepath.Base(filepath.Dir(p)), st); err != nil {
			return err
		}
	}
	return nil
}

// Hex parses a hexadecimal field such as CapBnd.
func Hex(status map[string]string, key string) (uint64, error) {
	v, err := strconv.ParseUint(status[key], 16, 64)
	if err != nil {
		return 0, fmt.Errorf("threadstatus: %s %q: %w", key, status[key], err)
	}
	return v, nil
}
