// Package agentpids is the agent's side of the gvisor driver's pids limit.
//
// The host's pids cgroup of a gVisor sandbox counts runsc's host tasks (the
// Sentry's threads, one systrap stub process per address space), not the
// sandbox's own tasks, which live in the Sentry. So the sandbox's limit is
// enforced inside, by the Sentry's own cgroup v2 pids controller
// (pkg/sentry/fsimpl/cgroup2fs/pids.go: a fork or clone that would take a
// cgroup or one of its ancestors past pids.max fails with EAGAIN before the
// task exists), and the host cgroup only bounds runsc with headroom.
//
// runsc runs with --in-sandbox-cgroup=v2, the spec mounts the Sentry's
// cgroup2 filesystem at /sys/fs/cgroup and names it in the agent's
// environment (EnvVar; the agent run elsewhere, e.g. on a host for
// development, leaves the host's cgroups alone). At start the agent (the container's
// init, in the container's cgroup /<id>) makes the cgroup GroupName at the
// top of that hierarchy (the root's subtree_control enables pids) and starts
// every command directly in it (clone3 CLONE_INTO_CGROUP, ProcAttr): the
// commands and all they fork count, the agent's own threads do not, so a
// fork bomb cannot starve the agent (a Go program that cannot create a
// thread dies). The driver sets pids.max through Path on the agent's socket:
//
//	PUT /v1/limits/pids   body: the limit in decimal ("max": none); 204
//	GET /v1/limits/pids   pids.max, pids.current, pids.events of the group
//	POST /v1/limits/pids/kill   SIGKILL every task of the group (cgroup.kill);
//	                            answers {"killed": pids.current before}
//
// The driver's memory guard uses the kill route when runsc's host memory
// nears its cgroup's limit, so that the commands end and not the Sentry.
//
// Root in the sandbox can write the cgroup files too (the Sentry sees it as
// root); moving out of the group only lets it exhaust the host limit, which
// kills its own sandbox and nothing else.
package agentpids

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Path is the agent's HTTP route for the limit.
const Path = "/v1/limits/pids"

// KillPath is the agent's HTTP route that kills the group's tasks.
const KillPath = Path + "/kill"

// Root is where the spec mounts the Sentry's cgroup2 filesystem.
const Root = "/sys/fs/cgroup"

// GroupName is the commands' cgroup below Root.
const GroupName = "space-commands"

// EnvVar, in the agent's environment, is the cgroup2 mount to keep the
// commands' cgroup in (Root under the gvisor driver).
const EnvVar = "SPACE_AGENT_PIDS_CGROUP"

// FromEnv sets up the group below the mount that EnvVar names; without
// EnvVar it returns nil and no error.
func FromEnv() (*Group, error) {
	root := os.Getenv(EnvVar)
	if root == "" {
		return nil, nil
	}
	return Setup(root)
}

// Group is the commands' cgroup.
type Group struct {
	dir string
	fd  int // open directory, for CLONE_INTO_CGROUP

	mu sync.Mutex // serialises writes of pids.max
}

// Setup makes (or reuses, after a restore) the commands' cgroup below root
// and opens it. root must be a cgroup2 mount with the pids controller.
func Setup(root string) (*Group, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return nil, fmt.Errorf("agentpids: %w", err)
	}
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		return nil, fmt.Errorf("agentpids: %s is not a cgroup2 mount (type %#x)", root, st.Type)
	}
	dir := filepath.Join(root, GroupName)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("agentpids: %w", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "pids.max")); err != nil {
		return nil, fmt.Errorf("agentpids: no pids controller in %s: %w", dir, err)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("agentpids: %w", err)
	}
	return &Group{dir: dir, fd: fd}, nil
}

// Dir is the group's directory.
func (g *Group) Dir() string { return g.dir }

// ProcAttr makes a process start in the group.
func (g *Group) ProcAttr(sys *syscall.SysProcAttr) {
	sys.UseCgroupFD = true
	sys.CgroupFD = g.fd
}

// SetMax writes pids.max: n > 0, or n <= 0 for no limit.
func (g *Group) SetMax(n int64) error {
	v := "max"
	if n > 0 {
		v = strconv.FormatInt(n, 10)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := os.WriteFile(filepath.Join(g.dir, "pids.max"), []byte(v), 0); err != nil {
		return fmt.Errorf("agentpids: %w", err)
	}
	return nil
}

// Kill sends SIGKILL to every task in the group and its descendants at
// once (cgroup.kill: forks cannot outrun it) and returns how many there
// were just before.
func (g *Group) Kill() (int64, error) {
	s, err := g.Status()
	if err != nil {
		return 0, err
	}
	if s.Current == 0 {
		return 0, nil
	}
	if err := os.WriteFile(filepath.Join(g.dir, "cgroup.kill"), []byte("1"), 0); err != nil {
		return 0, fmt.Errorf("agentpids: %w", err)
	}
	return s.Current, nil
}

// Killed is what POST KillPath answers.
type Killed struct {
	Killed int64 `json:"killed"` // tasks in the group when it was killed
}

// Status is what GET Path answers.
type Status struct {
	Max     string `json:"max"`     // pids.max: a number or "max"
	Current int64  `json:"current"` // pids.current
	Events  int64  `json:"events"`  // pids.events: forks refused at the limit
}

// Status reads the group's pids files.
func (g *Group) Status() (Status, error) {
	var s Status
	read := func(name string) (string, error) {
		b, err := os.ReadFile(filepath.Join(g.dir, name))
		return strings.TrimSpace(string(b)), err
	}
	var err error
	if s.Max, err = read("pids.max"); err != nil {
		return s, fmt.Errorf("agentpids: %w", err)
	}
	cur, err := read("pids.current")
	if err != nil {
		return s, fmt.Errorf("agentpids: %w", err)
	}
	s.Current, _ = strconv.ParseInt(cur, 10, 64)
	ev, err := read("pids.events")
	if err != nil {
		return s, fmt.Errorf("agentpids: %w", err)
	}
	if f := strings.Fields(ev); len(f) == 2 && f[0] == "max" {
		s.Events, _ = strconv.ParseInt(f[1], 10, 64)
	}
	return s, nil
}

// ParseMax parses a PUT body: a positive decimal, or "max".
func ParseMax(body string) (int64, error) {
	body = strings.TrimSpace(body)
	if body == "max" {
		return 0, nil
	}
	n, err := strconv.ParseInt(body, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("pids limit %q: want a positive number or \"max\"", body)
	}
	return n, nil
}

// Handler serves Path and passes everything else to h. A nil g (no
// cgroup here) answers 501 on Path, so the driver can tell.
func (g *Group) Handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != Path && r.URL.Path != KillPath {
			h.ServeHTTP(w, r)
			return
		}
		if g == nil {
			http.Error(w, "no in-sandbox pids cgroup", http.StatusNotImplemented)
			return
		}
		if r.URL.Path == KillPath {
			if r.Method != http.MethodPost {
				http.Error(w, "POST", http.StatusMethodNotAllowed)
				return
			}
			n, err := g.Kill()
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(Killed{Killed: n})
			return
		}
		switch r.Method {
		case http.MethodGet:
			s, err := g.Status()
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(s)
		case http.MethodPut:
			b, err := io.ReadAll(io.LimitReader(r.Body, 64))
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			n, err := ParseMax(string(b))
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			if err := g.SetMax(n); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusNoContent)
		default:
			http.Error(w, "GET or PUT", http.StatusMethodNotAllowed)
		}
	})
}
