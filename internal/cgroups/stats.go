package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Stats is a group's resource use as the kernel accounts it.
type Stats struct {
	// CPUUsageNs is the group's CPU time; CPUKnown is false where no
	// hierarchy of the group accounts it (v1 with cpuacct mounted apart
	// from cpu and no v2 tree).
	CPUUsageNs     uint64
	CPUKnown       bool
	CPULimitMillis int64 // 0: unlimited
	MemUsedBytes   int64 // usage minus inactive page cache
	MemLimitBytes  int64 // 0: unlimited
	MemCacheBytes  int64
}

// unlimitedMemory: v1 reports "no limit" as a huge page-rounded number.
const unlimitedMemory = 1 << 62

// Stats reads the group's CPU and memory accounting.
func (g *Group) Stats() (Stats, error) {
	var st Stats
	// Every v2 group has cpu.stat (the core's own accounting, whether or
	// not the cpu controller is enabled), hybrid hosts included.
	if d := g.p.Unified; d != "" {
		if data, err := os.ReadFile(filepath.Join(d, "cpu.stat")); err == nil {
			if us, err := parseKeyed(data, "usage_usec"); err == nil {
				st.CPUUsageNs, st.CPUKnown = us*1000, true
			}
		}
	}
	if d := g.p.CPU; d != "" {
		if !st.CPUKnown && d != g.p.Unified {
			// v1 with cpuacct co-mounted ("cpu,cpuacct").
			if n, err := readInt(filepath.Join(d, "cpuacct.usage")); err == nil && n >= 0 {
				st.CPUUsageNs, st.CPUKnown = uint64(n), true
			}
		}
		st.CPULimitMillis = cpuLimit(d, d == g.p.Unified)
	}
	d := g.p.Memory
	if d == "" {
		return st, errors.New("cgroups: no memory controller")
	}
	v2 := d == g.p.Unified
	usageFile, limitFile := "memory.usage_in_bytes", "memory.limit_in_bytes"
	cacheKey, inactiveKey := "total_cache", "total_inactive_file"
	if v2 {
		usageFile, limitFile, cacheKey, inactiveKey = "memory.current", "memory.max", "file", "inactive_file"
	}
	usage, err := readInt(filepath.Join(d, usageFile))
	if err != nil {
		return st, err
	}
	if lim, err := readInt(filepath.Join(d, limitFile)); err == nil && lim > 0 && lim < unlimitedMemory {
		st.MemLimitBytes = lim
	}
	var inactive uint64
	if data, err := os.ReadFile(filepath.Join(d, "memory.stat")); err == nil {
		if n, err := parseKeyed(data, cacheKey); err == nil {
			st.MemCacheBytes = int64(n)
		}
		if n, err := parseKeyed(data, inactiveKey); err == nil {
			inactive = n
		}
	}
	st.MemUsedBytes = max(usage-int64(inactive), 0)
	return st, nil
}

// cpuLimit reads the CFS bandwidth limit in thousandths of a CPU.
func cpuLimit(dir string, v2 bool) int64 {
	var quota, period int64
	if v2 {
		data, err := os.ReadFile(filepath.Join(dir, "cpu.max"))
		if err != nil {
			return 0
		}
		f := strings.Fields(string(data))
		if len(f) != 2 || f[0] == "max" {
			return 0
		}
		quota, _ = strconv.ParseInt(f[0], 10, 64)
		period, _ = strconv.ParseInt(f[1], 10, 64)
	} else {
		var err error
		if quota, err = readInt(filepath.Join(dir, "cpu.cfs_quota_us")); err != nil {
			return 0
		}
		if period, err = readInt(filepath.Join(dir, "cpu.cfs_period_us")); err != nil {
			return 0
		}
	}
	if quota <= 0 || period <= 0 {
		return 0
	}
	return quota * 1000 / period
}

// readInt reads a control file holding one integer ("max" is an error).
func readInt(path string) (int64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("cgroups: %w", err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cgroups: %s: %w", filepath.Base(path), err)
	}
	return n, nil
}
