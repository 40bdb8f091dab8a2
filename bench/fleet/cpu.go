package fleet

import (
	"bytes"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ProcessCPU is a process's user + system CPU time, all threads, from
// /proc/<pid>/stat (clock ticks of 1/100 s, Linux's USER_HZ).
func ProcessCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("CPU time: %w", err)
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// count fields after its closing one. utime and stime are fields 14 and
	// 15 of the line, 12 and 13 after the name.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("CPU time: malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("CPU time: short /proc/%d/stat", pid)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("CPU time: /proc/%d/stat: %v %v", pid, err1, err2)
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}

// SelfCPU is this process's user + system CPU time so far.
func SelfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// CheckLoopback accepts only http URLs whose host is a loopback address:
// the harnesses load a server hard and are not meant to do so across a
// network.
func CheckLoopback(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("-url: %w", err)
	}
	if u.Scheme != "http" || u.Host == "" {
		return fmt.Errorf("-url %q: want http://host:port", raw)
	}
	h := u.Hostname()
	if h == "localhost" {
		return nil
	}
	if ip := net.ParseIP(h); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("-url %q: only loopback targets (127.0.0.0/8, ::1, localhost) are allowed", raw)
}

// ProcessMemory is a process's resident memory now (VmRSS) and at its peak
// since it started (VmHWM), in bytes, from /proc/<pid>/status.
func ProcessMemory(pid int) (rss, peak uint64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0, fmt.Errorf("memory: %w", err)
	}
	for line := range strings.Lines(string(b)) {
		name, v, ok := strings.Cut(line, ":")
		if !ok || (name != "VmRSS" && name != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("memory: /proc/%d/status %s: %w", pid, name, err)
		}
		if name == "VmRSS" {
			rss = kb << 10
		} else {
			peak = kb << 10
		}
	}
	if rss == 0 || peak == 0 {
		return 0, 0, fmt.Errorf("memory: no VmRSS or VmHWM in /proc/%d/status", pid)
	}
	return rss, peak, nil
}
