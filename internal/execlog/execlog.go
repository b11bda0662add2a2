// Package execlog keeps the host-side record of one command's output: every
// event the agent sent, numbered from 1, in an append-only file. Clients read
// it from any sequence number, so a dropped data connection loses nothing and
// a command keeps running (and being recorded) with no client attached.
//
// What a log keeps is bounded by its Budget, which the logs of one sandbox
// share: when appending would pass the bound, the oldest output of those
// logs (in the order it was appended, across commands) is dropped first.
// Sequence numbers never change; a reader at a dropped position gets one
// Dropped event (its payload says how much is gone) and then the oldest
// event kept. Dropped records become holes in the file (fallocate
// PUNCH_HOLE), so the disk holds about what is kept; where the filesystem
// cannot punch holes, the file is rewritten with only what is kept.
//
// A log starts in memory and moves to its file (created then, with its
// directory) when it would pass memLogMax, or its budget's logs together
// would pass memBudgetMax: most commands print little, and creating,
// writing and removing a file per command was the largest cost of an exec
// on the host. Nothing reads a log file but its Log (a restarted node
// starts its logs again), so where the records are changes nothing else.
package execlog

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Event types mirror the agent's; Dropped is the log's own.
const (
	Stdout byte = 1
	Stderr byte = 2
	Exit   byte = 3
	// Dropped stands for the events a reader asked for that the log no
	// longer keeps; its payload is a JSON DropInfo and its Seq the last
	// dropped event's, so resuming after it continues with the oldest kept.
	Dropped byte = 4
)

const headerLen = 13 // seq u64 | type u8 | len u32

// EventOverhead is what each stored event counts against a Budget on top
// of its payload: its header on disk and its index entries in memory.
const EventOverhead = headerLen + 16

// compactAbove is the file size past which a log is rewritten with only
// what it keeps, even where holes can be punched (file size limits).
const compactAbove = 1 << 40

// The in-memory start of logs (see the package comment).
const (
	memLogMax    = 16 << 10
	memBudgetMax = 256 << 10
)

// ErrGone is returned for a position older than what the log retains.
var ErrGone = errors.New("execlog: events no longer retained")

// ErrClosed is returned by a reader of a closed log.
var ErrClosed = errors.New("execlog: log closed")

// Record is one stored event.
type Record struct {
	Seq  uint64
	Type byte
	Data []byte
}

// DropInfo is the payload of a Dropped event: the state of the log's head
// when it was read. A client that counted the output bytes it received
// from the start knows exactly how many it missed.
type DropInfo struct {
	// DroppedEvents is how many events the log dropped from its start:
	// events 1..DroppedEvents are gone.
	DroppedEvents uint64 `json:"dropped_events"`
	// DroppedBytes is the output (payload) bytes of those events.
	DroppedBytes int64 `json:"dropped_bytes"`
	// FirstSeq is the oldest event kept (DroppedEvents+1).
	FirstSeq uint64 `json:"first_seq"`
}

// Budget bounds the bytes a set of logs keeps (one sandbox's commands).
type Budget struct {
	max int64

	mu    sync.Mutex
	used  int64
	queue []span // the logs' kept output in append order, oldest first

	mem atomic.Int64 // bytes of the budget's logs held in memory
}

// span is a run of consecutive events one log appended.
type span struct {
	l *Log
	n int
}

// NewBudget returns a budget of maxBytes (payloads plus EventOverhead per
// event; exit events are not counted and never dropped).
func NewBudget(maxBytes int64) *Budget {
	return &Budget{max: max(maxBytes, 1)}
}

// Used returns the bytes the budget's logs keep.
func (b *Budget) Used() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// Log is one command's event log.
type Log struct {
	b    *Budget
	path string

	mu      sync.Mutex
	f       *os.File // nil while the records are in mem
	mem     []byte   // the records (file layout) until the file exists
	gen     uint64   // bumped when the file is rewritten (offsets change)
	first   uint64   // seq of offsets[0]; events before it were dropped
	offsets []int64  // offsets[i] = file offset of record first+i
	size    int64    // end of the file's last record
	punched int64    // file offsets below this are holes
	noPunch bool     // the filesystem cannot punch holes
	charged int64    // what this log's kept output counts in b

	droppedBytes int64 // payload bytes of the dropped events
	done         bool  // exit recorded or log closed
	closed       bool
	changed      chan struct{}
}

// Create makes a new log file at path with a budget of its own of maxBytes.
func Create(path string, maxBytes int64) (*Log, error) {
	return NewBudget(maxBytes).Create(path)
}

// Create makes a new log whose kept output counts in b. Its file, at path,
// is created when the log outgrows memory; path must not exist by then.
func (b *Budget) Create(path string) (*Log, error) {
	return &Log{b: b, path: path, first: 1, changed: make(chan struct{})}, nil
}

// spillLocked moves the records from memory to the log's new file.
func (l *Log) spillLocked() error {
	f, err := os.OpenFile(l.path, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if errors.Is(err, fs.ErrNotExist) {
		if err = os.MkdirAll(filepath.Dir(l.path), 0o700); err == nil {
			f, err = os.OpenFile(l.path, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
		}
	}
	if err != nil {
		return fmt.Errorf("create exec log: %w", err)
	}
	if _, err := f.WriteAt(l.mem, 0); err != nil {
		f.Close()
		os.Remove(l.path)
		return fmt.Errorf("execlog: write: %w", err)
	}
	l.f = f
	l.b.mem.Add(-int64(len(l.mem)))
	l.mem = nil
	if len(l.offsets) > 0 {
		l.release(l.offsets[0]) // records dropped while in memory
	}
	return nil
}

// Append stores one event and wakes readers, dropping the oldest output of
// the budget's logs first where it must. It returns the sequence number
// given to the event. An output event larger than the whole budget is
// counted (it gets its number) and dropped at once.
func (l *Log) Append(typ byte, data []byte) (uint64, error) {
	if typ == Exit {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.appendLocked(typ, data)
	}
	b := l.b
	cost := int64(EventOverhead + len(data))
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.used+cost > b.max && len(b.queue) > 0 {
		b.dropOldestLocked(b.used + cost - b.max)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if b.used+cost > b.max {
		if l.done {
			return 0, fmt.Errorf("execlog: append after exit")
		}
		// Larger than the whole budget: numbered, and gone.
		seq := l.lastSeqLocked() + 1
		if len(l.offsets) == 0 {
			l.first = seq + 1
			l.droppedBytes += int64(len(data))
			l.wakeLocked()
			return seq, nil
		}
		// Records are kept in sequence: only an empty log can skip one.
		return 0, fmt.Errorf("execlog: event of %d bytes larger than the budget (%d)", len(data), b.max)
	}
	seq, err := l.appendLocked(typ, data)
	if err != nil {
		return 0, err
	}
	b.used += cost
	l.charged += cost
	if n := len(b.queue); n > 0 && b.queue[n-1].l == l {
		b.queue[n-1].n++
	} else {
		b.queue = append(b.queue, span{l: l, n: 1})
	}
	return seq, nil
}

func (l *Log) lastSeqLocked() uint64 { return l.first + uint64(len(l.offsets)) - 1 }

func (l *Log) wakeLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

func (l *Log) appendLocked(typ byte, data []byte) (uint64, error) {
	if l.done {
		return 0, fmt.Errorf("execlog: append after exit")
	}
	if l.size > compactAbove {
		l.compactLocked()
	}
	seq := l.lastSeqLocked() + 1
	var hdr [headerLen]byte
	binary.BigEndian.PutUint64(hdr[0:8], seq)
	hdr[8] = typ
	binary.BigEndian.PutUint32(hdr[9:13], uint32(len(data)))
	n := headerLen + len(data)
	if l.f == nil {
		if l.size+int64(n) <= memLogMax {
			if l.b.mem.Add(int64(n)) <= memBudgetMax {
				l.mem = append(append(l.mem, hdr[:]...), data...)
				return l.appendedLocked(typ, seq, n), nil
			}
			l.b.mem.Add(-int64(n)) // the budget's memory is full
		}
		if err := l.spillLocked(); err != nil {
			return 0, err
		}
	}
	// One vectored write: no copy of the payload, one syscall.
	n, err := unix.Pwritev(int(l.f.Fd()), [][]byte{hdr[:], data}, l.size)
	if err == nil && n != headerLen+len(data) {
		err = io.ErrShortWrite
	}
	if err != nil {
		return 0, fmt.Errorf("execlog: write: %d of %d bytes: %w", n, headerLen+len(data), err)
	}
	return l.appendedLocked(typ, seq, n), nil
}

// appendedLocked indexes a record of n bytes just stored at l.size.
func (l *Log) appendedLocked(typ byte, seq uint64, n int) uint64 {
	l.offsets = append(l.offsets, l.size)
	l.size += int64(n)
	if typ == Exit {
		l.done = true
	}
	l.wakeLocked()
	return seq
}

// dropOldestLocked drops at least need bytes of the oldest output (or the
// whole oldest span). b.mu is held.
func (b *Budget) dropOldestLocked(need int64) {
	s := &b.queue[0]
	freed, n := s.l.dropFront(s.n, need)
	b.used -= freed
	if s.n -= n; s.n <= 0 || n == 0 {
		b.queue[0] = span{}
		b.queue = b.queue[1:]
	}
}

// dropFront drops up to max of the log's oldest records, stopping once
// need bytes are freed, and returns the bytes freed and records dropped.
func (l *Log) dropFront(maxN int, need int64) (int64, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var freed, data int64
	k := 0
	for k < maxN && k < len(l.offsets) && freed < need {
		end := l.size
		if k+1 < len(l.offsets) {
			end = l.offsets[k+1]
		}
		rec := end - l.offsets[k]
		freed += rec - headerLen + EventOverhead
		data += rec - headerLen
		k++
	}
	if k == 0 {
		return 0, 0
	}
	cut := l.size
	if k < len(l.offsets) {
		cut = l.offsets[k]
	}
	// The head moves before any byte goes: a reader that read a record
	// checks afterwards that it was still kept (Reader.Next).
	l.first += uint64(k)
	l.offsets = l.offsets[k:]
	if len(l.offsets) == 0 {
		l.offsets = nil // let the old array go
	}
	l.droppedBytes += data
	l.charged -= freed
	l.release(cut)
	l.wakeLocked()
	return freed, k
}

// release gives the disk blocks below file offset cut back: holes, or a
// rewrite of the file where holes cannot be punched.
func (l *Log) release(cut int64) {
	if l.f == nil {
		return // in memory: its bytes go with the log (bounded by memLogMax)
	}
	if l.noPunch {
		if cut > 1<<20 && cut > (l.size-cut) {
			l.compactLocked()
		}
		return
	}
	end := cut &^ (4<<10 - 1)
	if end <= l.punched {
		return
	}
	err := punchHole(l.f, l.punched, end-l.punched)
	if err == nil {
		l.punched = end
		return
	}
	l.noPunch = true
	l.compactLocked()
}

// punchHole is fallocate(PUNCH_HOLE); a variable for tests.
var punchHole = func(f *os.File, off, n int64) error {
	return unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
}

// compactLocked rewrites the file with only the kept records (at offset
// 0), renaming the new file over the old one. Readers notice the new
// generation and re-read.
func (l *Log) compactLocked() {
	base := l.size
	if len(l.offsets) > 0 {
		base = l.offsets[0]
	}
	if base == 0 || l.closed || l.f == nil {
		return
	}
	nf, err := os.CreateTemp(filepath.Dir(l.path), ".compact-*")
	if err != nil {
		return
	}
	if _, err := io.Copy(nf, io.NewSectionReader(l.f, base, l.size-base)); err != nil {
		nf.Close()
		os.Remove(nf.Name())
		return
	}
	if err := os.Rename(nf.Name(), l.path); err != nil {
		nf.Close()
		os.Remove(nf.Name())
		return
	}
	old := l.f
	l.f = nf
	for i := range l.offsets {
		l.offsets[i] -= base
	}
	l.size -= base
	l.punched = 0
	l.gen++
	old.Close() // a reader still in ReadAt holds its own reference
}

// Finish marks the log complete without an exit event (the command was
// lost); readers see io.EOF after the last record.
func (l *Log) Finish() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.done {
		l.done = true
		l.wakeLocked()
	}
}

// Truncated reports whether output was dropped for size.
func (l *Log) Truncated() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.first > 1
}

// Dropped reports the log's head: what it dropped so far (see DropInfo).
func (l *Log) Dropped() DropInfo {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dropInfoLocked()
}

func (l *Log) dropInfoLocked() DropInfo {
	return DropInfo{DroppedEvents: l.first - 1, DroppedBytes: l.droppedBytes, FirstSeq: l.first}
}

// LastSeq returns the number of stored events, dropped ones included.
func (l *Log) LastSeq() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastSeqLocked()
}

// Close releases the file (or the records in memory) and the log's share
// of its budget. Its readers, blocked in Next or not, get ErrClosed.
func (l *Log) Close() error {
	l.Finish()
	b := l.b
	b.mu.Lock()
	l.mu.Lock()
	b.used -= l.charged
	l.charged = 0
	l.closed = true
	f := l.f
	b.mem.Add(-int64(len(l.mem)))
	l.mem = nil
	l.mu.Unlock()
	q := b.queue[:0]
	for _, s := range b.queue {
		if s.l != l {
			q = append(q, s)
		}
	}
	clear(b.queue[len(q):])
	b.queue = q
	b.mu.Unlock()
	if f == nil {
		return nil
	}
	return f.Close()
}

// Reader follows the log from a position.
type Reader struct {
	l    *Log
	next uint64 // next seq to return
	buf  []byte
}

// NewReader returns a reader that yields events with seq > after. If
// some of them were dropped, the first event it yields is a Dropped one.
func (l *Log) NewReader(after uint64) (*Reader, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if last := l.lastSeqLocked(); after > last && l.done {
		return nil, fmt.Errorf("execlog: position %d beyond the end (%d): %w", after, last, ErrGone)
	}
	return &Reader{l: l, next: after + 1}, nil
}

// Next returns the next record, waiting for it if needed. It returns io.EOF
// after the last record of a finished log. The returned Data is valid until
// the next call.
func (r *Reader) Next(ctx context.Context) (Record, error) {
	l := r.l
	for {
		l.mu.Lock()
		if l.closed {
			// Its records may be gone with it (in memory: they are).
			l.mu.Unlock()
			return Record{}, ErrClosed
		}
		if r.next < l.first {
			info := l.dropInfoLocked()
			l.mu.Unlock()
			r.buf, _ = json.Marshal(info)
			r.next = info.FirstSeq
			return Record{Seq: info.FirstSeq - 1, Type: Dropped, Data: r.buf}, nil
		}
		last, done, changed := l.lastSeqLocked(), l.done, l.changed
		var off, end int64
		var f *os.File
		gen := l.gen
		if r.next <= last {
			i := r.next - l.first
			off, end, f = l.offsets[i], l.size, l.f
			if i+1 < uint64(len(l.offsets)) {
				end = l.offsets[i+1]
			}
			if f == nil {
				// In memory: copied under the lock (a spill takes mem away).
				r.buf = append(r.buf[:0], l.mem[off:end]...)
				l.mu.Unlock()
				b := r.buf
				r.next++
				return Record{Seq: binary.BigEndian.Uint64(b[0:8]), Type: b[8], Data: b[headerLen:]}, nil
			}
		}
		l.mu.Unlock()
		if f != nil {
			sz := int(end - off)
			if cap(r.buf) < sz {
				r.buf = make([]byte, sz)
			}
			b := r.buf[:sz]
			_, err := f.ReadAt(b, off)
			// Dropped (or moved) while it was read: start over.
			l.mu.Lock()
			stale := r.next < l.first || gen != l.gen
			l.mu.Unlock()
			if stale {
				continue
			}
			if err != nil {
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
	return r.next <= r.l.lastSeqLocked() || r.l.done
}

// Wait returns a channel that is closed when the log changes, or nil if
// Next would already return without waiting.
func (r *Reader) Wait() <-chan struct{} {
	r.l.mu.Lock()
	defer r.l.mu.Unlock()
	if r.next <= r.l.lastSeqLocked() || r.l.done {
		return nil
	}
	return r.l.changed
}
