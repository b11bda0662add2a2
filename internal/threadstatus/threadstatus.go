// Package threadstatus reads the kernel's view of every thread of the
// calling process (/proc/self/task/<tid>/status), so that security state
// set per thread (capability sets, no_new_privs, seccomp) can be checked on
// all of them after it was changed.
package threadstatus

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"
)

// Each calls fn with the named fields of the status file of every thread
// of the process (keys "CapBnd", "Seccomp", ...: "CapBnd" →
// "000001ffffffffff"); a field the file lacks is absent from the map. A
// thread that ends meanwhile is skipped; finding no thread at all is an
// error.
//
// It lists /proc/self/task and opens each <tid>/status by name. A glob of
// /proc/self/task/*/status would list every thread's directory as well,
// and each listing makes a procfs inode and dentry for all of its ~50
// entries: in a sandbox, whose procfs is its own, that left about 0.35 MiB
// of kernel memory per sandbox behind and cost milliseconds at start.
// Only the named fields are kept, read through one buffer per reader: a
// map of every field of every thread, made a few times at an agent's
// start, was about 0.3 MiB of garbage that no collection ever freed (the
// agent's heap stays under the first GC's target), charged to every idle
// sandbox.
func Each(keys []string, fn func(tid string, status map[string]string) error) error {
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
		st  map[string]string
		err error
	}
	res := make([]result, len(tids))
	read := func(i int, buf *[]byte) {
		var b []byte
		b, res[i].err = readInto("/proc/self/task/"+tids[i]+"/status", buf)
		if res[i].err == nil {
			res[i].st = fields(b, keys)
		}
	}
	buf := make([]byte, 0, 4096)
	t0 := time.Now()
	read(0, &buf)
	if time.Since(t0) <= slowRead {
		for i := 1; i < len(tids); i++ {
			read(i, &buf)
		}
	} else {
		next := make(chan int)
		var wg sync.WaitGroup
		for range min(readers, len(tids)-1) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := make([]byte, 0, 4096)
				for i := range next {
					read(i, &buf)
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
		if errors.Is(res[i].err, os.ErrNotExist) {
			continue
		}
		if res[i].err != nil {
			return fmt.Errorf("threadstatus: %w", res[i].err)
		}
		if err := fn(tid, res[i].st); err != nil {
			return err
		}
	}
	return nil
}

// readInto reads the file at path into *buf (grown if it must be) and
// returns the bytes read.
func readInto(path string, buf *[]byte) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := (*buf)[:0]
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := f.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF || n == 0 && err == nil {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	*buf = b
	return b, nil
}

// fields returns the values of keys in a status file's "Key:\tvalue" lines.
func fields(b []byte, keys []string) map[string]string {
	st := make(map[string]string, len(keys))
	for len(b) > 0 {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte{'\n'})
		k, v, ok := bytes.Cut(line, []byte{':'})
		if !ok {
			continue
		}
		for _, want := range keys {
			if string(k) == want {
				st[want] = string(bytes.TrimSpace(v))
			}
		}
	}
	return st
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
