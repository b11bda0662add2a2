package namespace

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/space-sandbox/space/internal/cgroups"
)

const stateVersion = 1

// state is what a restarted node needs to find a sandbox again.
type state struct {
	Version   int           `json:"version"`
	ID        string        `json:"id"`
	PID       int           `json:"pid"`        // host pid of the sandbox's PID 1
	StartTime uint64        `json:"start_time"` // /proc/<pid>/stat start time, against pid reuse
	PidNS     uint64        `json:"pid_ns"`     // inode of its pid namespace, ditto
	Socket    string        `json:"socket"`
	Cgroups   cgroups.Paths `json:"cgroups"`
	Created   time.Time     `json:"created"`
	// UIDBase is the sandbox's first host id; 0 in sandboxes made before
	// per-sandbox ranges, which run under the driver's UIDBase.
	UIDBase uint32 `json:"uid_base,omitempty"`
	// Handoff, while a checkpoint runs, is the agent's descriptor that
	// waits for a listener (agenthandoff): a node that died meanwhile
	// hands one in when it attaches again.
	Handoff int `json:"handoff_fd,omitempty"`
}

// setHandoff records (fd > 0) or clears (0) a checkpoint's pending
// listener handoff in sandbox id's state.
func (d *Driver) setHandoff(id string, fd int) error {
	dir := d.sandboxDir(id)
	st, err := readState(dir)
	if err != nil {
		return fmt.Errorf("namespace: %w", err)
	}
	st.Handoff = fd
	return writeState(dir, st)
}

func writeState(dir string, st state) error {
	st.Version = stateVersion
	b, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("namespace: %w", err)
	}
	tmp := filepath.Join(dir, "state.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("namespace: write state: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "state.json")); err != nil {
		return fmt.Errorf("namespace: write state: %w", err)
	}
	return nil
}

func readState(dir string) (state, error) {
	var st state
	b, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("bad state.json: %w", err)
	}
	if st.Version != stateVersion {
		return st, fmt.Errorf("state.json version %d, want %d", st.Version, stateVersion)
	}
	return st, nil
}
