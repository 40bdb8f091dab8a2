// Package logwatch collects the JSON log lines a kvselect server writes (the
// --log-format json output, from several goroutines at once) and finds the
// records tests wait for, such as the startup line that names the address a
// --port 0 server was given.
package logwatch

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
)

// Buffer is an io.Writer that is safe for concurrent use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Attr returns the string attribute key of the first JSON record in logs
// whose msg is msg; false when there is none yet.
func Attr(logs, msg, key string) (string, bool) {
	for line := range strings.SplitSeq(logs, "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil || rec["msg"] != msg {
			continue
		}
		if v, ok := rec[key].(string); ok {
			return v, true
		}
	}
	return "", false
}
