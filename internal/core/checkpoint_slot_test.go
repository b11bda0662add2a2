package core

import "testing"

// TestCheckpointSlots: automatic checkpoints are bounded per node, not per
// replica, and a finished one frees its node's slot.
func TestCheckpointSlots(t *testing.T) {
	s := &Service{}
	for i := 0; i < checkpointsPerNode; i++ {
		if !s.takeCheckpointSlot("n1") {
			t.Fatalf("slot %d of n1 refused", i)
		}
	}
	if s.takeCheckpointSlot("n1") {
		t.Fatal("n1 got more than checkpointsPerNode slots")
	}
	if !s.takeCheckpointSlot("n2") {
		t.Fatal("n2 refused while only n1 is full")
	}
	s.releaseCheckpointSlot("n1")
	if !s.takeCheckpointSlot("n1") {
		t.Fatal("a released slot of n1 was not reused")
	}
	s.releaseCheckpointSlot("n2")
	if _, ok := s.ckptNode["n2"]; ok {
		t.Fatal("an idle node's count is kept")
	}
}
