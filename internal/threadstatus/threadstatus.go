// Package threadstatus reads the kernel's view of every thread of the
// calling process (/proc/self/task/<tid>/status), so that security state
// set per thread (capability sets, no_new_privs, seccomp) can be checked on
// all of them after it was changed.
package threadstatus

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Each calls fn with the fields of the status file of every thread of the
// process ("CapBnd" → "000001ffffffffff", "Seccomp" → "2", ...). A thread
// that ends meanwhile is skipped; finding no thread at all is an error.
//
// It lists /proc/self/task and opens each <tid>/status by name. A glob of
// /proc/self/task/*/status would list every thread's directory as well,
// and each listing makes a procfs inode and dentry for all of its ~50
// entries: in a sandbox, whose procfs is its own, that left about 0.35 MiB
// of kernel memory per sandbox behind and cost milliseconds at start.
func Each(fn func(tid string, status map[string]string) error) error {
	tids, err := TIDs()
	if err != nil {
		return err
	}
	// On a host a status file reads in microseconds; in gVisor each read
	// waits about a millisecond on the Sentry, for twenty threads of an
	// agent. So when the first read is slow the rest are read a few at a
	// time. fn still runs in this goroutine, in the listing's order; the
	// readers run on threads the runtime already has (the agents keep a
	// reserve).
	type result struct {
		b   []byte
		err error
	}
	res := make([]result, len(tids))
	t0 := time.Now()
	read := func(i int) { res[i].b, res[i].err = os.ReadFile("/proc/self/task/" + tids[i] + "/status") }
	read(0)
	if time.Since(t0) <= slowRead {
		for i := 1; i < len(tids); i++ {
			read(i)
		}
	} else {
		next := make(chan int)
		var wg sync.WaitGroup
		for range min(readers, len(tids)-1) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					read(i)
				}
			}()
		}
		for i := 1; i < len(tids); i++ {
			next <- i
		}
		close(next)
		wg.Wait()
	}
	for i, tid := range tids {
		b, err := res[i].b, res[i].err
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
		if err := fn(tid, st); err != nil {
			return err
		}
	}
	return nil
}

// readers is how many status files Each reads at once when one read
// takes longer than slowRead.
const (
	readers  = 4
	slowRead = 200 * time.Microsecond
)

// taskIDs lists the thread ids in /proc/self/task.
func taskIDs() ([]string, error) {
	d, err := os.Open("/proc/self/task")
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	tids := names[:0]
	for _, n := range names {
		if _, err := strconv.Atoi(n); err == nil {
			tids = append(tids, n)
		}
	}
	return tids, nil
}

// TIDs lists the ids of the process's threads (/proc/self/task).
func TIDs() ([]string, error) {
	tids, err := taskIDs()
	if err != nil || len(tids) == 0 {
		return nil, fmt.Errorf("threadstatus: list /proc/self/task: %d threads, %v", len(tids), err)
	}
	return tids, nil
}

// Hex parses a hexadecimal field such as CapBnd.
func Hex(status map[string]string, key string) (uint64, error) {
	v, err := strconv.ParseUint(status[key], 16, 64)
	if err != nil {
		return 0, fmt.Errorf("threadstatus: %s %q: %w", key, status[key], err)
	}
	return v, nil
}
