package execlog

import (
	"bytes"
	"context"
	"errors"
	"io"
	"path/filepath"
	"testing"
	"time"
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

func TestSizeCapKeepsExit(t *testing.T) {
	l, _ := Create(filepath.Join(t.TempDir(), "log"), 100)
	defer l.Close()
	big := bytes.Repeat([]byte("x"), 60)
	if seq, _ := l.Append(Stdout, big); seq != 1 {
		t.Fatal("first chunk dropped")
	}
	if seq, _ := l.Append(Stdout, big); seq != 0 {
		t.Fatal("chunk past the cap stored")
	}
	if seq, _ := l.Append(Exit, []byte(`{}`)); seq != 2 {
		t.Fatalf("exit not stored after cap (seq %d)", seq)
	}
	if !l.Truncated() {
		t.Fatal("truncation not reported")
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
