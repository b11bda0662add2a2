// Package execlog keeps the host-side record of one command's output: every
// event the agent sent, numbered from 1, in an append-only file. Clients read
// it from any sequence number, so a dropped data connection loses nothing and
// a command keeps running (and being recorded) with no client attached.
package execlog

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Event types mirror the agent's.
const (
	Stdout byte = 1
	Stderr byte = 2
	Exit   byte = 3
)

const headerLen = 13 // seq u64 | type u8 | len u32

// ErrGone is returned for a position older than what the log retains.
var ErrGone = errors.New("execlog: events no longer retained")

// Record is one stored event.
type Record struct {
	Seq  uint64
	Type byte
	Data []byte
}

// Log is one command's event log.
type Log struct {
	f        *os.File
	maxBytes int64

	mu        sync.Mutex
	offsets   []int64 // offsets[seq-1] = file offset of record seq
	size      int64
	truncated bool // output dropped after maxBytes
	done      bool // exit recorded or log closed
	changed   chan struct{}
}

// Create makes a new log file at path. Output beyond maxBytes is dropped
// (the exit event is always kept) so a noisy command cannot fill the disk.
func Create(path string, maxBytes int64) (*Log, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create exec log: %w", err)
	}
	return &Log{f: f, maxBytes: maxBytes, changed: make(chan struct{})}, nil
}

// Append stores one event and wakes readers. It returns the sequence number
// given to the event, or 0 if the event was dropped for size.
func (l *Log) Append(typ byte, data []byte) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		return 0, fmt.Errorf("execlog: append after exit")
	}
	if typ != Exit && l.size+int64(headerLen+len(data)) > l.maxBytes {
		l.truncated = true
		return 0, nil
	}
	seq := uint64(len(l.offsets)) + 1
	var hdr [headerLen]byte
	binary.BigEndian.PutUint64(hdr[0:8], seq)
	hdr[8] = typ
	binary.BigEndian.PutUint32(hdr[9:13], uint32(len(data)))
	// One vectored write: no copy of the payload, one syscall.
	n, err := unix.Pwritev(int(l.f.Fd()), [][]byte{hdr[:], data}, l.size)
	if err == nil && n != headerLen+len(data) {
		err = io.ErrShortWrite
	}
	if err != nil {
		return 0, fmt.Errorf("execlog: write: %d of %d bytes: %w", n, headerLen+len(data), err)
	}
	l.offsets = append(l.offsets, l.size)
	l.size += int64(n)
	if typ == Exit {
		l.done = true
	}
	close(l.changed)
	l.changed = make(chan struct{})
	return seq, nil
}

// Finish marks the log complete without an exit event (the command was
// lost); readers see io.EOF after the last record.
func (l *Log) Finish() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.done {
		l.done = true
		close(l.changed)
		l.changed = make(chan struct{})
	}
}

// Truncated reports whether output was dropped for size.
func (l *Log) Truncated() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.truncated
}

// LastSeq returns the number of stored events.
func (l *Log) LastSeq() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return uint64(len(l.offsets))
}

// Close releases the file. Readers blocked in Next return an error.
func (l *Log) Close() error {
	l.Finish()
	return l.f.Close()
}

// Reader follows the log from a position.
type Reader struct {
	l    *Log
	next uint64 // next seq to return
	buf  []byte
}

// NewReader returns a reader that yields events with seq > after.
func (l *Log) NewReader(after uint64) (*Reader, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if after > uint64(len(l.offsets)) && l.done {
		return nil, fmt.Errorf("execlog: position %d beyond the end (%d): %w", after, len(l.offsets), ErrGone)
	}
	return &Reader{l: l, next: after + 1}, nil
}

// Next returns the next record, waiting for it if needed. It returns io.EOF
// after the last record of a finished log. The returned Data is valid until
// the next call.
func (r *Reader) Next(ctx context.Context) (Record, error) {
	for {
		r.l.mu.Lock()
		n := uint64(len(r.l.offsets))
		done := r.l.done
		changed := r.l.changed
		var off, end int64
		if r.next <= n {
			off = r.l.offsets[r.next-1]
			if r.next < n {
				end = r.l.offsets[r.next]
			} else {
				end = r.l.size
			}
		}
		r.l.mu.Unlock()
		if r.next <= n {
			sz := int(end - off)
			if cap(r.buf) < sz {
				r.buf = make([]byte, sz)
			}
			b := r.buf[:sz]
			if _, err := r.l.f.ReadAt(b, off); err != nil {
				return Record{}, fmt.Errorf("execlog: read: %w", err)
			}
			rec := Record{Seq: binary.BigEndian.Uint64(b[0:8]), Type: b[8], Data: b[headerLen:]}
			r.next++
			return rec, nil
		}
		if done {
			return Record{}, io.EOF
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return Record{}, ctx.Err()
		}
	}
}

// Ready reports whether Next would return without waiting.
func (r *Reader) Ready() bool {
	r.l.mu.Lock()
	defer r.l.mu.Unlock()
	return r.next <= uint64(len(r.l.offsets)) || r.l.done
}

// Wait returns a channel that is closed when the log changes, or nil if
// Next would already return without waiting.
func (r *Reader) Wait() <-chan struct{} {
	r.l.mu.Lock()
	defer r.l.mu.Unlock()
	if r.next <= uint64(len(r.l.offsets)) || r.l.done {
		return nil
	}
	return r.l.changed
}
