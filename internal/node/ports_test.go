package node

import (
	"net"
	"testing"
)

// A parked connection is handed to the next TakePort without counting as
// an open tunnel while idle; one parked before the sandbox was frozen or
// captured (dropParked) is closed, and a connection in use then is not
// parked afterwards.
func TestParkPort(t *testing.T) {
	s := &Sandbox{ID: "sb"}
	a, b := net.Pipe()
	defer b.Close()
	s.openTunnels.Add(1)
	c := &countedConn{Conn: a, sb: s}
	s.ParkPort(49999, c)
	if n := s.openTunnels.Load(); n != 0 {
		t.Fatalf("open tunnels %d with one parked", n)
	}
	c.Close() // the caller's deferred Close must not close the parked conn
	got, reused, err := s.TakePort(t.Context(), 49999)
	if err != nil || !reused {
		t.Fatal(reused, err)
	}
	if got.(*countedConn).Conn != a || s.openTunnels.Load() != 1 {
		t.Fatalf("took %v (open tunnels %d), want the parked connection", got, s.openTunnels.Load())
	}
	s.dropParked() // frozen while in use
	s.ParkPort(49999, got)
	s.parkMu.Lock()
	_, ok := s.parked[49999]
	s.parkMu.Unlock()
	if ok {
		t.Error("a connection in use across dropParked was parked")
	}
	if _, err := b.Write([]byte("x")); err == nil {
		t.Error("a connection refused for parking was left open")
	}
	a2, b2 := net.Pipe()
	defer b2.Close()
	s.openTunnels.Add(1)
	s.ParkPort(49999, &countedConn{Conn: a2, sb: s, epoch: s.parkEpoch.Load()})
	s.dropParked()
	if _, err := b2.Write([]byte("x")); err == nil {
		t.Error("dropParked left the parked connection open")
	}
	if s.openTunnels.Load() != 0 {
		t.Errorf("open tunnels %d", s.openTunnels.Load())
	}
}
