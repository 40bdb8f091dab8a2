//go:build !vtprotobuf

package vtcodec

import "testing"

// Without the tag the codec falls back to protobuf-go (TestSameBytesAsProtobufGo
// covers that path).
func TestFast(t *testing.T) {
	if Fast() {
		t.Fatal("built without -tags vtprotobuf but Fast() reports the generated encoder")
	}
}
