package httpx

import (
	"net/http/httptest"
	"strings"
	"testing"
)

// TestSSEOrderAcrossBufferSwitch: small events, a large one (which moves
// the stream to the bulk buffer), then small ones again arrive whole and in
// order, and nothing reaches the client before a Flush.
func TestSSEOrderAcrossBufferSwitch(t *testing.T) {
	rec := httptest.NewRecorder()
	s := StartSSE(rec)
	if s.big {
		t.Fatal("a new stream starts with the bulk buffer")
	}
	start := rec.Body.Len() // the headers' flush
	big := strings.Repeat("x", 3*bulkEvent)
	want := "id: 1\nevent: a\ndata: one\n\n" +
		"id: 2\nevent: b\ndata: " + big + "\n\n" +
		"id: 3\nevent: c\ndata: three\n\n"
	for _, e := range []struct{ id, ev, data string }{{"1", "a", "one"}, {"2", "b", big}, {"3", "c", "three"}} {
		if err := s.Event(e.id, e.ev, []byte(e.data)); err != nil {
			t.Fatal(err)
		}
	}
	if !s.big {
		t.Error("a large event did not move the stream to the bulk buffer")
	}
	if got := rec.Body.String()[start:]; strings.Contains(got, "three") {
		t.Errorf("the last event reached the client before Flush: %q", got)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := rec.Body.String()[start:]; got != want {
		t.Errorf("stream = %.120q…, want %.120q…", got, want)
	}
}
