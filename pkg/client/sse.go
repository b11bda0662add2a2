package client

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"
)

// ErrEventTooLarge is returned when an SSE line or event exceeds the
// parser's bound; the stream is then unusable.
var ErrEventTooLarge = errors.New("server-sent event too large")

// sseEvent is one dispatched server-sent event.
type sseEvent struct {
	ID   string // the last event id in effect (ids persist across events)
	Type string // "message" when the event named none
	Data []byte // data lines joined by "\n"; valid until the next call to next
}

// sseParser reads a text/event-stream as the WHATWG HTML spec defines it:
// lines end in CRLF, LF or a lone CR; lines starting with ':' are comments;
// "field: value" drops one leading space from the value; several data lines
// join with "\n"; an empty line dispatches; an event with no data is not
// dispatched; an incomplete event at EOF is discarded. Unlike a browser it
// bounds line and event sizes, because the bytes come from the network.
type sseParser struct {
	r       *bufio.Reader
	max     int
	skipLF  bool // the previous line ended in CR: a following LF is part of it
	started bool // the optional BOM has been checked

	line   []byte
	data   []byte
	typ    []byte
	hasDat bool
	lastID string
	retry  time.Duration
}

func newSSEParser(r io.Reader, maxEvent int) *sseParser {
	if maxEvent <= 0 {
		maxEvent = 4 << 20
	}
	return &sseParser{r: bufio.NewReaderSize(r, 64<<10), max: maxEvent}
}

// LastEventID is the id to send as Last-Event-ID when reconnecting.
func (p *sseParser) LastEventID() string { return p.lastID }

// Retry is the reconnection delay the server asked for, 0 if none.
func (p *sseParser) Retry() time.Duration { return p.retry }

// next returns the next event, io.EOF at a clean end of stream, or
// io.ErrUnexpectedEOF if the stream ended inside an event.
func (p *sseParser) next() (sseEvent, error) {
	for {
		line, err := p.readLine()
		if err != nil {
			if err == io.EOF && (len(line) > 0 || p.hasDat || len(p.typ) > 0) {
				err = io.ErrUnexpectedEOF
			}
			return sseEvent{}, err
		}
		if len(line) == 0 {
			if !p.hasDat {
				p.typ = p.typ[:0]
				continue
			}
			ev := sseEvent{ID: p.lastID, Type: "message", Data: bytes.TrimSuffix(p.data, []byte{'\n'})}
			if len(p.typ) > 0 {
				ev.Type = string(p.typ)
			}
			p.data, p.typ, p.hasDat = p.data[:0], p.typ[:0], false
			return ev, nil
		}
		if line[0] == ':' {
			continue
		}
		field, value := line, []byte(nil)
		if i := bytes.IndexByte(line, ':'); i >= 0 {
			field, value = line[:i], line[i+1:]
			if len(value) > 0 && value[0] == ' ' {
				value = value[1:]
			}
		}
		switch string(field) {
		case "data":
			if len(p.data)+len(value)+1 > p.max {
				return sseEvent{}, fmt.Errorf("%w: more than %d bytes of data", ErrEventTooLarge, p.max)
			}
			p.data = append(append(p.data, value...), '\n')
			p.hasDat = true
		case "event":
			p.typ = append(p.typ[:0], value...)
		case "id":
			if bytes.IndexByte(value, 0) < 0 {
				p.lastID = string(value)
			}
		case "retry":
			if n, err := strconv.ParseUint(string(value), 10, 31); err == nil {
				p.retry = time.Duration(n) * time.Millisecond
			}
		}
	}
}

// readLine returns the next line without its terminator. It never blocks
// waiting for the LF of a CRLF pair: a lone CR ends the line at once and a
// following LF is skipped when the next line is read.
func (p *sseParser) readLine() ([]byte, error) {
	p.line = p.line[:0]
	if !p.started {
		p.started = true
		if b, err := p.r.Peek(3); err == nil && bytes.Equal(b, []byte("\xef\xbb\xbf")) {
			p.r.Discard(3)
		}
	}
	if p.skipLF {
		b, err := p.r.Peek(1)
		if err != nil {
			return nil, err
		}
		p.skipLF = false
		if b[0] == '\n' {
			p.r.Discard(1)
		}
	}
	for {
		if p.r.Buffered() == 0 {
			if _, err := p.r.Peek(1); err != nil {
				return p.line, err
			}
		}
		buf, _ := p.r.Peek(p.r.Buffered())
		i := bytes.IndexAny(buf, "\r\n")
		n := i
		if i < 0 {
			n = len(buf)
		}
		if len(p.line)+n > p.max {
			return nil, fmt.Errorf("%w: line longer than %d bytes", ErrEventTooLarge, p.max)
		}
		p.line = append(p.line, buf[:n]...)
		if i < 0 {
			p.r.Discard(n)
			continue
		}
		p.skipLF = buf[i] == '\r'
		p.r.Discard(i + 1)
		return p.line, nil
	}
}
