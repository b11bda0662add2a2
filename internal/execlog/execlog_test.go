package execlog

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestAppendFollowResume(t *testing.T) {
	l, err := Create(filepath.Join(t.TempDir(), "log"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got := make(chan []Record, 1)
	rd, _ := l.NewReader(0)
	go func() {
		var recs []Record
		for {
			r, err := rd.Next(ctx)
			if err != nil {
				got <- recs
				return
			}
			r.Data = append([]byte(nil), r.Data...)
			recs = append(recs, r)
		}
	}()
	for i := 0; i < 100; i++ {
		if _, err := l.Append(Stdout, []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	l.Append(Exit, []byte(`{"exit_code":0}`))
	recs := <-got
	if len(recs) != 101 || recs[100].Type != Exit {
		t.Fatalf("follower got %d records", len(recs))
	}
	for i, r := range recs[:100] {
		if r.Seq != uint64(i+1) || r.Data[0] != byte(i) {
			t.Fatalf("record %d: seq %d data %v", i, r.Seq, r.Data)
		}
	}
	// Resume after 60: exactly the rest, once.
	rd2, _ := l.NewReader(60)
	n := 0
	for {
		r, err := rd2.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if r.Seq != uint64(61+n) {
			t.Fatalf("resume: seq %d, want %d", r.Seq, 61+n)
		}
		n++
	}
	if n != 41 {
		t.Fatalf("resume got %d records, want 41", n)
	}
	if _, err := l.NewReader(500); !errors.Is(err, ErrGone) {
		t.Fatalf("reader past the end of a finished log: %v", err)
	}
}

// readAll reads rd to the end (or until ctx ends), copying each record.
func readAll(t *testing.T, rd *Reader) []Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var recs []Record
	for {
		r, err := rd.Next(ctx)
		if errors.Is(err, io.EOF) {
			return recs
		}
		if err != nil {
			t.Fatal(err)
		}
		r.Data = append([]byte(nil), r.Data...)
		recs = append(recs, r)
	}
}

func dropInfo(t *testing.T, r Record) DropInfo {
	t.Helper()
	if r.Type != Dropped {
		t.Fatalf("record %d is type %d, want a Dropped marker", r.Seq, r.Type)
	}
	var d DropInfo
	if err := json.Unmarshal(r.Data, &d); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestDropOldest: past its budget a log drops its oldest output; a reader
// from a dropped position gets one Dropped marker, then the oldest kept
// event; the exit is always kept; the file's blocks follow what is kept.
func TestDropOldest(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	const chunk = 4000
	l, err := Create(path, 10*(chunk+EventOverhead))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	live, _ := l.NewReader(0)
	for i := 1; i <= 100; i++ {
		if seq, err := l.Append(Stdout, bytes.Repeat([]byte{byte(i)}, chunk)); err != nil || seq != uint64(i) {
			t.Fatalf("append %d: seq %d, %v", i, seq, err)
		}
	}
	if seq, err := l.Append(Exit, []byte(`{"code":0}`)); err != nil || seq != 101 {
		t.Fatalf("exit: %d %v", seq, err)
	}
	if !l.Truncated() || l.LastSeq() != 101 {
		t.Fatalf("truncated %v, last %d", l.Truncated(), l.LastSeq())
	}
	want := DropInfo{DroppedEvents: 90, DroppedBytes: 90 * chunk, FirstSeq: 91}
	if got := l.Dropped(); got != want {
		t.Fatalf("Dropped() = %+v, want %+v", got, want)
	}
	// From the start, and from a dropped position: marker, 91..100, exit.
	for _, after := range []uint64{0, 50, 89} {
		rd, err := l.NewReader(after)
		if err != nil {
			t.Fatal(err)
		}
		recs := readAll(t, rd)
		if len(recs) != 12 || dropInfo(t, recs[0]) != want || recs[0].Seq != 90 {
			t.Fatalf("after %d: %d records, first %+v", after, len(recs), recs[0])
		}
		for i, r := range recs[1:11] {
			if r.Seq != uint64(91+i) || r.Type != Stdout || len(r.Data) != chunk || r.Data[0] != byte(91+i) || r.Data[chunk-1] != byte(91+i) {
				t.Fatalf("after %d: record %d: seq %d type %d data[0] %d", after, i, r.Seq, r.Type, r.Data[0])
			}
		}
		if recs[11].Seq != 101 || recs[11].Type != Exit {
			t.Fatalf("after %d: last %+v", after, recs[11])
		}
	}
	// Resuming after the marker's id (the last dropped event) or inside
	// what is kept needs no marker.
	rd, _ := l.NewReader(90)
	if recs := readAll(t, rd); len(recs) != 11 || recs[0].Seq != 91 {
		t.Fatalf("after 90: %d records, first seq %d", len(recs), recs[0].Seq)
	}
	// The reader that followed from the start fell behind: marker, then on.
	recs := readAll(t, live)
	if dropInfo(t, recs[0]).FirstSeq != 91 || len(recs) != 12 {
		t.Fatalf("live reader: %d records, first %+v", len(recs), recs[0])
	}
	// The disk holds what is kept (one partial block of slack).
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	if onDisk, kept := st.Blocks*512, int64(11*(chunk+headerLen)); onDisk > kept+8<<10 {
		t.Fatalf("file holds %d bytes on disk for %d kept (size %d)", onDisk, kept, st.Size)
	}
}

// TestBudgetAcrossLogs: logs sharing a budget drop the oldest output of
// any of them first, in append order; closing a log frees its share.
func TestBudgetAcrossLogs(t *testing.T) {
	dir := t.TempDir()
	const chunk = 1000
	b := NewBudget(6 * (chunk + EventOverhead))
	a, _ := b.Create(filepath.Join(dir, "a"))
	c, _ := b.Create(filepath.Join(dir, "c"))
	data := bytes.Repeat([]byte("x"), chunk)
	for i := 0; i < 3; i++ { // a1 a2 a3, then c1..c3: full
		a.Append(Stdout, data)
	}
	a.Append(Exit, []byte(`{}`))
	for i := 0; i < 3; i++ {
		c.Append(Stderr, data)
	}
	if a.Truncated() || c.Truncated() {
		t.Fatal("dropped before the budget was full")
	}
	c.Append(Stderr, data) // drops a1
	c.Append(Stderr, data) // drops a2
	if a.Dropped().FirstSeq != 3 || c.Truncated() {
		t.Fatalf("a %+v, c truncated %v", a.Dropped(), c.Truncated())
	}
	for i := 0; i < 2; i++ { // a3, then c1
		c.Append(Stderr, data)
	}
	if a.Dropped().FirstSeq != 4 || c.Dropped().FirstSeq != 2 {
		t.Fatalf("a %+v, c %+v", a.Dropped(), c.Dropped())
	}
	// a keeps its exit, and nothing else.
	rd, _ := a.NewReader(0)
	if recs := readAll(t, rd); len(recs) != 2 || recs[0].Type != Dropped || recs[1].Type != Exit || recs[1].Seq != 4 {
		t.Fatalf("a: %+v", recs)
	}
	if used := b.Used(); used != 6*(chunk+EventOverhead) {
		t.Fatalf("budget used %d", used)
	}
	c.Close()
	if used := b.Used(); used != 0 {
		t.Fatalf("after closing c, budget used %d", used)
	}
	a.Close()
}

// TestNoPunch: where holes cannot be punched the file is rewritten with
// what is kept, and readers (also one in the middle of the log) go on.
func TestNoPunch(t *testing.T) {
	old := punchHole
	punchHole = func(*os.File, int64, int64) error { return unix.EOPNOTSUPP }
	defer func() { punchHole = old }()
	path := filepath.Join(t.TempDir(), "log")
	const chunk = 64 << 10
	l, _ := Create(path, 8*(chunk+EventOverhead))
	defer l.Close()
	rd, _ := l.NewReader(0)
	for i := 1; i <= 200; i++ {
		l.Append(Stdout, bytes.Repeat([]byte{byte(i)}, chunk))
		if i == 1 {
			if r, err := rd.Next(context.Background()); err != nil || r.Seq != 1 {
				t.Fatalf("first read: %+v %v", r, err)
			}
		}
	}
	l.Append(Exit, []byte(`{}`))
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > 1<<20+10*(chunk+headerLen) { // rewritten once 1 MiB is dead
		t.Fatalf("file is %d bytes for 8 kept events", fi.Size())
	}
	recs := readAll(t, rd)
	if len(recs) != 10 || dropInfo(t, recs[0]).FirstSeq != 193 || recs[1].Seq != 193 || recs[1].Data[0] != 193 || recs[9].Type != Exit {
		t.Fatalf("%d records, first %+v", len(recs), recs[0])
	}
}

// TestHugeEvent: an event larger than the whole budget is numbered and
// dropped; what follows is kept.
func TestHugeEvent(t *testing.T) {
	l, _ := Create(filepath.Join(t.TempDir(), "log"), 1000)
	defer l.Close()
	if seq, err := l.Append(Stdout, make([]byte, 5000)); err != nil || seq != 1 {
		t.Fatalf("huge: %d %v", seq, err)
	}
	if seq, _ := l.Append(Stdout, []byte("small")); seq != 2 {
		t.Fatalf("next: %d", seq)
	}
	l.Append(Exit, []byte(`{}`))
	rd, _ := l.NewReader(0)
	recs := readAll(t, rd)
	if len(recs) != 3 || dropInfo(t, recs[0]) != (DropInfo{1, 5000, 2}) || string(recs[1].Data) != "small" {
		t.Fatalf("%+v", recs)
	}
}

func BenchmarkAppendRead(b *testing.B) {
	l, _ := Create(filepath.Join(b.TempDir(), "log"), 1<<40)
	defer l.Close()
	chunk := make([]byte, 32<<10)
	rd, _ := l.NewReader(0)
	b.SetBytes(int64(len(chunk)))
	for i := 0; i < b.N; i++ {
		l.Append(Stdout, chunk)
		if _, err := rd.Next(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

// TestConcurrentDrop: readers racing a writer that drops all the time see
// every event at most once, in order, each either intact or replaced by a
// marker, never a half-dropped record.
func TestConcurrentDrop(t *testing.T) {
	l, _ := Create(filepath.Join(t.TempDir(), "log"), 64*(512+EventOverhead))
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := make(chan error, 4)
	for r := 0; r < 4; r++ {
		go func() {
			rd, _ := l.NewReader(0)
			next := uint64(1)
			for {
				rec, err := rd.Next(ctx)
				if errors.Is(err, io.EOF) {
					errs <- nil
					return
				}
				if err != nil {
					errs <- err
					return
				}
				switch rec.Type {
				case Dropped:
					var d DropInfo
					json.Unmarshal(rec.Data, &d)
					if d.FirstSeq < next || rec.Seq != d.FirstSeq-1 {
						errs <- fmt.Errorf("marker %+v at %d, expecting %d", d, rec.Seq, next)
						return
					}
					next = d.FirstSeq
				case Stdout:
					want := bytes.Repeat([]byte{byte(rec.Seq)}, 512)
					if rec.Seq != next || !bytes.Equal(rec.Data, want) {
						errs <- fmt.Errorf("record %d (want %d) corrupt", rec.Seq, next)
						return
					}
					next++
				case Exit:
					if rec.Seq != next {
						errs <- fmt.Errorf("exit %d, want %d", rec.Seq, next)
						return
					}
					next++
				}
			}
		}()
	}
	for i := 1; i <= 20000; i++ {
		l.Append(Stdout, bytes.Repeat([]byte{byte(i)}, 512))
	}
	l.Append(Exit, []byte(`{}`))
	for r := 0; r < 4; r++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// BenchmarkAppendDropping is BenchmarkAppendRead past a full 8 MiB
// budget: every append drops the oldest event and punches its hole.
func BenchmarkAppendDropping(b *testing.B) {
	l, _ := Create(filepath.Join(b.TempDir(), "log"), 8<<20)
	defer l.Close()
	chunk := make([]byte, 32<<10)
	for l.Dropped().DroppedEvents == 0 {
		l.Append(Stdout, chunk)
	}
	rd, _ := l.NewReader(l.LastSeq())
	b.SetBytes(int64(len(chunk)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		l.Append(Stdout, chunk)
		if _, err := rd.Next(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

// TestMemoryThenFile: a small log is never written to disk; one that
// outgrows memory moves to its file (creating its directory) and a reader
// that began in memory reads on from the file without a gap or a repeat.
func TestMemoryThenFile(t *testing.T) {
	dir := t.TempDir()
	b := NewBudget(64 << 20)
	small, _ := b.Create(filepath.Join(dir, "small.log"))
	defer small.Close()
	small.Append(Stdout, []byte("hello"))
	small.Append(Exit, []byte(`{"code":0}`))
	if _, err := os.Stat(filepath.Join(dir, "small.log")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a small log has a file: %v", err)
	}
	rd, _ := small.NewReader(0)
	if recs := readAll(t, rd); len(recs) != 2 || string(recs[0].Data) != "hello" || recs[1].Type != Exit {
		t.Fatalf("small log: %+v", recs)
	}

	path := filepath.Join(dir, "sub", "big.log") // the directory does not exist yet
	big, _ := b.Create(path)
	defer big.Close()
	rd, _ = big.NewReader(0)
	var want []byte
	const chunk = 3000
	for i := 1; i <= 20; i++ {
		p := bytes.Repeat([]byte{byte(i)}, chunk)
		want = append(want, p...)
		if _, err := big.Append(Stdout, p); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
		if i == 2 { // read in memory
			if r, err := rd.Next(context.Background()); err != nil || r.Seq != 1 {
				t.Fatalf("first read: %+v %v", r, err)
			}
		}
	}
	big.Append(Exit, []byte(`{}`))
	fi, err := os.Stat(path)
	if err != nil || fi.Size() < 20*chunk {
		t.Fatalf("big log's file: %v %v", fi, err)
	}
	got := bytes.Repeat([]byte{1}, chunk)
	for _, r := range readAll(t, rd) {
		if r.Type == Stdout {
			got = append(got, r.Data...)
		}
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, want %d, equal %v", len(got), len(want), bytes.Equal(got, want))
	}
	if b.mem.Load() != int64(len(small.mem)) {
		t.Fatalf("budget holds %d bytes in memory, the small log %d", b.mem.Load(), len(small.mem))
	}
}

// TestMemoryBudget: a budget's logs together keep at most memBudgetMax in
// memory; past it new output goes to files, and closing gives it back.
func TestMemoryBudget(t *testing.T) {
	dir := t.TempDir()
	b := NewBudget(64 << 20)
	var logs []*Log
	var files int
	for i := 0; i < 2*memBudgetMax/memLogMax; i++ {
		l, _ := b.Create(filepath.Join(dir, fmt.Sprintf("%d.log", i)))
		logs = append(logs, l)
		if _, err := l.Append(Stdout, make([]byte, memLogMax-100)); err != nil {
			t.Fatal(err)
		}
		l.Append(Exit, []byte(`{}`))
		if _, err := os.Stat(l.path); err == nil {
			files++
		}
		if m := b.mem.Load(); m > memBudgetMax {
			t.Fatalf("after %d logs %d bytes in memory", i+1, m)
		}
	}
	if files < len(logs)/2-1 {
		t.Fatalf("%d of %d logs have files", files, len(logs))
	}
	for _, l := range logs {
		rd, _ := l.NewReader(0)
		if recs := readAll(t, rd); len(recs) != 2 || len(recs[0].Data) != memLogMax-100 {
			t.Fatalf("%s: %d records", l.path, len(recs))
		}
		l.Close()
	}
	if m := b.mem.Load(); m != 0 {
		t.Fatalf("%d bytes in memory after every log closed", m)
	}
}

// TestDropInMemory: a log whose budget drops its oldest output while it is
// still in memory reports the drop like a file-backed one.
func TestDropInMemory(t *testing.T) {
	l, _ := Create(filepath.Join(t.TempDir(), "log"), 3*(100+EventOverhead))
	defer l.Close()
	for i := 1; i <= 10; i++ {
		l.Append(Stdout, bytes.Repeat([]byte{byte(i)}, 100))
	}
	l.Append(Exit, []byte(`{}`))
	if l.f != nil {
		t.Fatal("a 1.3 KiB log moved to its file")
	}
	rd, _ := l.NewReader(0)
	recs := readAll(t, rd)
	if len(recs) != 5 || dropInfo(t, recs[0]).FirstSeq != 8 || recs[1].Data[0] != 8 || recs[4].Type != Exit {
		t.Fatalf("%d records: %+v", len(recs), recs)
	}
}

// TestReadAfterClose: a reader of a log that was closed under it (the
// node prunes finished commands while a client may still replay one)
// gets an error, whether the records were in memory or in the file.
func TestReadAfterClose(t *testing.T) {
	for _, size := range []int{100, memLogMax} {
		l, _ := Create(filepath.Join(t.TempDir(), "log"), 1<<20)
		l.Append(Stdout, bytes.Repeat([]byte{'x'}, size))
		l.Append(Exit, []byte(`{}`))
		rd, _ := l.NewReader(0)
		l.Close()
		if rec, err := rd.Next(context.Background()); err == nil {
			t.Fatalf("%d bytes: read %d bytes of type %d from a closed log", size, len(rec.Data), rec.Type)
		}
		if rd2, err := l.NewReader(0); err == nil {
			if _, err := rd2.Next(context.Background()); err == nil {
				t.Fatalf("%d bytes: a new reader read a closed log", size)
			}
		}
	}
}
