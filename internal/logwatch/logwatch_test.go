package logwatch

import (
	"fmt"
	"sync"
	"testing"
)

func TestAttrFindsTheFirstMatchingRecord(t *testing.T) {
	logs := `{"msg":"other","addr":"no"}
not json
{"msg":"kvselect listening","addr":"127.0.0.1:1"}
{"msg":"kvselect listening","addr":"127.0.0.1:2"}
`
	tests := []struct {
		msg, key, want string
		ok             bool
	}{
		{"kvselect listening", "addr", "127.0.0.1:1", true},
		{"kvselect listening", "port", "", false},
		{"ext_proc listening", "addr", "", false},
	}
	for _, tc := range tests {
		got, ok := Attr(logs, tc.msg, tc.key)
		if got != tc.want || ok != tc.ok {
			t.Errorf("Attr(%q, %q) = %q, %v; want %q, %v", tc.msg, tc.key, got, ok, tc.want, tc.ok)
		}
	}
}

func TestBufferKeepsConcurrentWrites(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() { fmt.Fprintf(&b, "{\"msg\":\"m%d\",\"addr\":\"a%d\"}\n", i, i) })
	}
	wg.Wait()
	for i := range 8 {
		if got, ok := Attr(b.String(), fmt.Sprintf("m%d", i), "addr"); !ok || got != fmt.Sprintf("a%d", i) {
			t.Errorf("record m%d: got %q, %v", i, got, ok)
		}
	}
}
