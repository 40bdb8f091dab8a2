package demo

import (
	"testing"

	"github.com/kvselect/kvselect/bench/floorpicker/floortest"
)

// The floor phases start the floor picker as a process of its own: this test
// binary, which serves it when floortest.Command started it.
func TestMain(m *testing.M) { floortest.Main(m) }
