package gvisor

import (
	"encoding/json"
	"fmt"
	"github.com/space-sandbox/space/internal/sandboxinit"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/space-sandbox/space/internal/cgroups"
	"github.com/space-sandbox/space/internal/driver/gvisor/agentpids"
)

// The subset of the OCI runtime spec (v1.0) the driver writes.
type (
	ociSpec struct {
		Version  string     `json:"ociVersion"`
		Process  ociProcess `json:"process"`
		Root     ociRoot    `json:"root"`
		Hostname string     `json:"hostname"`
		Mounts   []ociMount `json:"mounts"`
		Linux    ociLinux   `json:"linux"`
	}
	ociProcess struct {
		User            ociUser  `json:"user"`
		Args            []string `json:"args"`
		Env             []string `json:"env"`
		Cwd             string   `json:"cwd"`
		Capabilities    ociCaps  `json:"capabilities"`
		NoNewPrivileges bool     `json:"noNewPrivileges"`
		OOMScoreAdj     *int     `json:"oomScoreAdj,omitempty"`
	}
	ociUser struct {
		UID uint32 `json:"uid"`
		GID uint32 `json:"gid"`
	}
	ociCaps struct {
		Bounding  []string `json:"bounding"`
		Effective []string `json:"effective"`
		Permitted []string `json:"permitted"`
	}
	ociRoot struct {
		Path     string `json:"path"`
		Readonly bool   `json:"readonly"`
	}
	ociMount struct {
		Destination string   `json:"destination"`
		Type        string   `json:"type"`
		Source      string   `json:"source"`
		Options     []string `json:"options,omitempty"`
	}
	ociLinux struct {
		Namespaces  []ociNamespace `json:"namespaces"`
		UIDMappings []ociIDMap     `json:"uidMappings"`
		GIDMappings []ociIDMap     `json:"gidMappings"`
		CgroupsPath string         `json:"cgroupsPath"`
		Resources   ociResources   `json:"resources"`
	}
	ociNamespace struct {
		Type string `json:"type"`
		Path string `json:"path,omitempty"`
	}
	ociIDMap struct {
		ContainerID uint32 `json:"containerID"`
		HostID      uint32 `json:"hostID"`
		Size        uint32 `json:"size"`
	}
	ociResources struct {
		Memory *ociMemory `json:"memory,omitempty"`
		CPU    *ociCPU    `json:"cpu,omitempty"`
		Pids   *ociPids   `json:"pids,omitempty"`
	}
	ociMemory struct {
		Limit *int64 `json:"limit,omitempty"`
	}
	ociCPU struct {
		Quota  *int64  `json:"quota,omitempty"`
		Period *uint64 `json:"period,omitempty"`
	}
	ociPids struct {
		Limit int64 `json:"limit"`
	}
)

// caps is what the sandbox's root holds inside gVisor: Docker's default set
// minus CAP_NET_RAW (raw sockets are the spoofing and sniffing tool).
var caps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
	"CAP_SYS_CHROOT", "CAP_MKNOD", "CAP_AUDIT_WRITE", "CAP_SETFCAP",
}

const cfsPeriod = 100000 // µs

// ociSpec builds the container's spec.
func (d *Driver) ociSpec(id, hostname, rootfs, sockDir, netns string, uidBase uint32, l cgroups.Limits) ociSpec {
	netNS := ociNamespace{Type: "network"}
	if netns != "" {
		netNS.Path = netns
	}
	idMap := []ociIDMap{{ContainerID: 0, HostID: uidBase, Size: d.opts.UIDCount}}
	var res ociResources
	if l.MemoryBytes > 0 {
		m := l.MemoryBytes
		res.Memory = &ociMemory{Limit: &m} // swap: see Instance.SetLimits
	}
	if l.CPUMillis > 0 {
		q, p := l.CPUMillis*cfsPeriod/1000, uint64(cfsPeriod)
		res.CPU = &ociCPU{Quota: &q, Period: &p}
	}
	if l.Pids > 0 {
		res.Pids = &ociPids{Limit: hostPids(l.Pids)}
	}
	return ociSpec{
		Version: "1.0.2",
		Process: ociProcess{
			Args:            append(append([]string{agentInside}, d.opts.AgentArgs...), runDirInside+"/"+sockName),
			Env:             append(slices.Clone(d.opts.Env), agentpids.EnvVar+"="+agentpids.Root),
			Cwd:             "/",
			Capabilities:    ociCaps{Bounding: caps, Effective: caps, Permitted: caps},
			NoNewPrivileges: true,
		},
		Root:     ociRoot{Path: rootfs},
		Hostname: hostname,
		Mounts: []ociMount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "mode=755"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777",
				"size=" + strconv.FormatInt(sandboxinit.ShmSize(l.MemoryBytes), 10)}},
			// The Sentry's own cgroup2 filesystem (--in-sandbox-cgroup=v2),
			// not the host's: the agent keeps the commands' pids cgroup in
			// it (agentpids).
			{Destination: agentpids.Root, Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: agentInside, Type: "bind", Source: d.opts.AgentPath, Options: []string{"rbind", "ro"}},
			{Destination: runDirInside, Type: "bind", Source: sockDir, Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}},
		},
		Linux: ociLinux{
			Namespaces: []ociNamespace{
				{Type: "pid"}, netNS, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"}, {Type: "user"},
			},
			UIDMappings: idMap,
			GIDMappings: idMap,
			CgroupsPath: d.cgroupsPath(id),
			Resources:   res,
		},
	}
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		return fmt.Errorf("gvisor: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("gvisor: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("gvisor: %w", err)
	}
	return nil
}

const stateVersion = 1

// state is what a restarted node needs to find a sandbox again.
type state struct {
	Version   int           `json:"version"`
	ID        string        `json:"id"`
	PID       int           `json:"pid"`        // host pid of runsc's sandbox process
	StartTime uint64        `json:"start_time"` // its /proc/<pid>/stat start time
	Network   string        `json:"network"`    // runsc --network: none or sandbox
	NetNS     string        `json:"netns,omitempty"`
	Platform  string        `json:"platform"`
	Cgroups   cgroups.Paths `json:"cgroups"`
	Created   string        `json:"created"`
	// UIDBase is the sandbox's first host id; 0 in sandboxes made before
	// per-sandbox ranges, which run under the driver's UIDBase.
	UIDBase uint32 `json:"uid_base,omitempty"`
}

func writeState(dir string, st state) error {
	st.Version = stateVersion
	return writeJSON(filepath.Join(dir, "state.json"), st)
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
