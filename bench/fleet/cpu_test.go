package fleet

import (
	"os"
	"testing"
	"time"
)

// ProcessCPU reads a process's CPU time: this process's grows while it works.
func TestProcCPUCountsWork(t *testing.T) {
	c0, err := ProcessCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); {
		for i := range 1000 {
			x += i
		}
	}
	c1, err := ProcessCPU(os.Getpid())
	if err != nil || c1 <= c0 || x == 0 {
		t.Fatalf("CPU %v then %v (%v)", c0, c1, err)
	}
	if _, err := ProcessCPU(-1); err == nil {
		t.Fatal("no error for a process that does not exist")
	}
}

// Only http URLs on loopback are targets.
func TestCheckLoopback(t *testing.T) {
	for raw, ok := range map[string]bool{
		"http://127.0.0.1:8080": true, "http://localhost:1": true, "http://[::1]:2": true,
		"http://192.0.2.1:8080": false, "https://localhost:8080": false, "127.0.0.1:80": false,
	} {
		if err := CheckLoopback(raw); (err == nil) != ok {
			t.Errorf("%s: %v", raw, err)
		}
	}
}
