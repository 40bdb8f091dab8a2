//go:build vtprotobuf

package vtcodec

import "testing"

// The Makefile and CI build with the vtprotobuf tag: the generated encoder
// must then be the one in use.
func TestFast(t *testing.T) {
	if !Fast() {
		t.Fatal("built with -tags vtprotobuf but ext_proc messages lack the generated marshal methods")
	}
}
