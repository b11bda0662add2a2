package agent

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"syscall"
)

// Metrics is what the sandbox itself sees of its resources (GET
// /v1/metrics): the kernel's view inside it, which is the sandbox's own in
// a VM or under gVisor and the host's under plain namespaces (the host
// side prefers its cgroup figures there). Disk is statfs of "/", right
// for every driver.
type Metrics struct {
	CPUCount int `json:"cpu_count"`
	// CPUBusyNs and CPUTotalNs are /proc/stat's all-CPU totals (busy =
	// everything but idle and iowait) since boot, in nanoseconds.
	CPUBusyNs  uint64 `json:"cpu_busy_ns"`
	CPUTotalNs uint64 `json:"cpu_total_ns"`
	MemTotal   int64  `json:"mem_total"`
	MemUsed    int64  `json:"mem_used"` // MemTotal - MemAvailable
	MemCache   int64  `json:"mem_cache"`
	DiskTotal  int64  `json:"disk_total"`
	DiskUsed   int64  `json:"disk_used"`
}

// userHZ is the unit of /proc/stat's counters (fixed at 100 for userspace
// on Linux, whatever the kernel's own HZ).
const userHZ = 100

// maxProcRead bounds what is read of a /proc file.
const maxProcRead = 256 << 10

func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	m := Metrics{CPUCount: runtime.NumCPU()}
	if data, err := readProc("/proc/stat"); err == nil {
		m.CPUBusyNs, m.CPUTotalNs = parseProcStat(data)
	}
	if data, err := readProc("/proc/meminfo"); err == nil {
		m.MemTotal, m.MemUsed, m.MemCache = parseMeminfo(data)
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs("/", &st); err == nil {
		bs := int64(st.Bsize)
		m.DiskTotal = int64(st.Blocks) * bs
		m.DiskUsed = (int64(st.Blocks) - int64(st.Bfree)) * bs
	}
	writeJSON(w, http.StatusOK, m)
}

func readProc(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxProcRead))
}

// parseProcStat sums the "cpu" line: user nice system idle iowait irq
// softirq steal (guest time is already in user).
func parseProcStat(data []byte) (busy, total uint64) {
	line, _, _ := bytes.Cut(data, []byte("\n"))
	f := bytes.Fields(line)
	if len(f) < 5 || string(f[0]) != "cpu" {
		return 0, 0
	}
	const ns = 1e9 / userHZ
	for i, v := range f[1:min(len(f), 9)] {
		n, err := strconv.ParseUint(string(v), 10, 64)
		if err != nil {
			return 0, 0
		}
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy * ns, total * ns
}

// parseMeminfo returns MemTotal, MemTotal-MemAvailable and Cached in bytes.
func parseMeminfo(data []byte) (total, used, cache int64) {
	var avail int64 = -1
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) < 2 {
			continue
		}
		kb, err := strconv.ParseInt(string(f[1]), 10, 64)
		if err != nil || kb < 0 {
			continue
		}
		switch string(f[0]) {
		case "MemTotal:":
			total = kb << 10
		case "MemAvailable:":
			avail = kb << 10
		case "Cached:":
			cache = kb << 10
		}
	}
	if avail >= 0 && avail <= total {
		used = total - avail
	}
	return total, used, cache
}
