package agent

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"sync"
	"time"
)

// errEventsGone means events a reader asked for were dropped from retention.
var errEventsGone = errors.New("agent: events dropped from retention")

// eventLog is one process's numbered output. It retains up to budget bytes
// of event data so a reader can resume with after=N. When the budget is full,
// events that every attached reader has already sent are dropped; if an
// attached reader still needs the oldest event, append blocks instead, which
// stops reading the command's pipe and so, through the pipe, the command.
// With no reader attached the oldest events are dropped, but only after
// readerGrace without one: the host attaches its reader just after the
// command starts and re-attaches after a dropped connection, and output
// produced in those gaps must not be lost.
type eventLog struct {
	budget      int
	readerGrace time.Duration
	abort       <-chan struct{} // server shutdown: a blocked append gives up

	mu      sync.Mutex
	events  []Event // contiguous seqs, events[0].Seq == first
	first   uint64  // seq of events[0]; next when empty
	next    uint64  // seq of the next event
	bytes   int     // data bytes held in events
	closed  bool    // the exit event is in; nothing more is appended
	readers map[*logReader]struct{}
	changed chan struct{} // closed and replaced when something changes
	// appendWaiting says an append is blocked on a lagging reader, so a
	// reader's progress must wake it (and otherwise need not allocate).
	appendWaiting bool
	// noReaderSince is when the log last had no reader: its creation or
	// the last detach that left it without one.
	noReaderSince time.Time
}

// logReader is one attached reader; pos is the last seq it has sent.
type logReader struct {
	pos uint64
}

func newEventLog(budget int, readerGrace time.Duration, abort <-chan struct{}) *eventLog {
	return &eventLog{
		budget:        budget,
		readerGrace:   readerGrace,
		noReaderSince: time.Now(),
		abort:         abort,
		first:         1,
		next:          1,
		readers:       make(map[*logReader]struct{}),
		changed:       make(chan struct{}),
	}
}

func (l *eventLog) broadcastLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// minPosLocked is the lowest seq every attached reader has sent.
func (l *eventLog) minPosLocked() uint64 {
	m := uint64(math.MaxUint64)
	for r := range l.readers {
		m = min(m, r.pos)
	}
	return m
}

// append adds an output event, blocking while an attached reader lags behind
// a full buffer. It reports false when the log is closed or the server stops;
// the data is then discarded.
func (l *eventLog) append(typ byte, data []byte) bool {
	l.mu.Lock()
	for {
		if l.closed {
			l.mu.Unlock()
			return false
		}
		if len(l.events) == 0 || l.bytes+len(data) <= l.budget {
			break
		}
		var wait time.Duration
		if len(l.readers) == 0 {
			wait = l.readerGrace - time.Since(l.noReaderSince)
		}
		if wait <= 0 && l.events[0].Seq <= l.minPosLocked() {
			l.dropOldestLocked()
			continue
		}
		l.appendWaiting = true
		ch := l.changed
		l.mu.Unlock()
		var timer *time.Timer
		var timeout <-chan time.Time
		if wait > 0 {
			timer = time.NewTimer(wait)
			timeout = timer.C
		}
		aborted := false
		select {
		case <-ch:
		case <-timeout:
		case <-l.abort:
			aborted = true
		}
		if timer != nil {
			timer.Stop()
		}
		if aborted {
			return false
		}
		l.mu.Lock()
	}
	l.addLocked(typ, data)
	l.mu.Unlock()
	return true
}

// appendFinal adds the exit event and closes the log. It never blocks: the
// exit event may exceed the budget.
func (l *eventLog) appendFinal(data []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.addLocked(EventExit, data)
	l.closed = true
}

// retained reports the data bytes held.
func (l *eventLog) retained() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.bytes
}

func (l *eventLog) addLocked(typ byte, data []byte) {
	l.events = append(l.events, Event{Seq: l.next, Type: typ, Data: data})
	l.next++
	l.bytes += len(data)
	l.broadcastLocked()
}

func (l *eventLog) dropOldestLocked() {
	l.bytes -= len(l.events[0].Data)
	l.events[0] = Event{}
	l.events = l.events[1:]
	l.first++
	if len(l.events) == 0 {
		l.events = nil // let the backing array go
	}
}

// attach registers a reader that has sent everything up to after. It fails
// with errEventsGone when events after that were already dropped.
func (l *eventLog) attach(after uint64) (*logReader, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if after+1 < l.first {
		return nil, errEventsGone
	}
	r := &logReader{pos: after}
	l.readers[r] = struct{}{}
	return r, nil
}

func (l *eventLog) detach(r *logReader) {
	l.mu.Lock()
	delete(l.readers, r)
	if len(l.readers) == 0 {
		l.noReaderSince = time.Now()
	}
	l.broadcastLocked() // a blocked append may now drop
	l.mu.Unlock()
}

// stream writes every event after r's position to w, following live events,
// until the exit event has been written, ctx ends or a write fails. flush is
// called whenever the reader has caught up.
func (l *eventLog) stream(ctx context.Context, r *logReader, w *bufio.Writer, flush func() error) error {
	var hdr [FrameHeaderSize]byte
	for {
		l.mu.Lock()
		if r.pos+1 < l.first {
			l.mu.Unlock()
			return errEventsGone // cannot happen while attached; be safe
		}
		var batch []Event
		if r.pos+1 < l.next {
			batch = l.events[r.pos+1-l.first:]
		}
		done := l.closed && len(batch) == 0
		ch := l.changed
		l.mu.Unlock()

		if done {
			return nil
		}
		if len(batch) == 0 {
			if err := flush(); err != nil {
				return err
			}
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		// batch's elements are never modified: drops only clear events
		// at or below every reader's position, and ours is below them.
		for i := range batch {
			e := &batch[i]
			binary.BigEndian.PutUint64(hdr[0:8], e.Seq)
			hdr[8] = e.Type
			binary.BigEndian.PutUint32(hdr[9:13], uint32(len(e.Data)))
			if _, err := w.Write(hdr[:]); err != nil {
				return err
			}
			if _, err := w.Write(e.Data); err != nil {
				return err
			}
		}
		last := batch[len(batch)-1]
		l.mu.Lock()
		r.pos = last.Seq
		if l.appendWaiting {
			l.appendWaiting = false
			l.broadcastLocked()
		}
		l.mu.Unlock()
		if last.Type == EventExit {
			return flush()
		}
	}
}
