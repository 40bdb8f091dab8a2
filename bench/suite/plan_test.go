package suite

import (
	"strings"
	"testing"

	"github.com/kvselect/kvselect/bench/fleet"
	"github.com/kvselect/kvselect/bench/vsepp"
)

func TestPlan(t *testing.T) {
	c := Config{Base: vsepp.Defaults(), Families: []fleet.Family{fleet.FamilySim, fleet.FamilyMock}, Workloads: Workloads,
		Shapes: []string{"seqs4"}, LadderRate: []float64{20, 40}, Repeat: 3}
	c.Base.Out = t.TempDir()
	cells, cfgs, err := c.plan()
	if err != nil {
		t.Fatal(err)
	}
	// Per family: conversation, text, shared-prefix, multi-turn and two
	// ladder steps; the first cell twice more.
	if len(cells) != 2*6+2 || len(cfgs) != len(cells) {
		t.Fatalf("%d cells, %d configs, want 14", len(cells), len(cfgs))
	}
	for i, cell := range cells {
		vc := cfgs[i]
		if cell.Family == string(fleet.FamilyMock) && cell.Workload == ConversationText {
			for _, p := range vc.Pickers {
				if !vsepp.IsKvselect(p) {
					t.Errorf("%s runs %s: the mock cannot render text for the EPP", cell.Name, p)
				}
			}
		}
		if vc.Engine.MaxNumSeqs != 4 || vc.Family != fleet.Family(cell.Family) {
			t.Errorf("%s: engines %+v family %s", cell.Name, vc.Engine, vc.Family)
		}
	}
	if cells[13].Run != 3 || !strings.HasSuffix(cells[13].Name, "#3") || cfgs[13].Out == cfgs[0].Out {
		t.Errorf("repeat: %+v in %s", cells[13], cfgs[13].Out)
	}
}

func TestCellsFlag(t *testing.T) {
	c := Config{Base: vsepp.Defaults(), Repeat: 1, Cells: []string{"llmd-sim/seqs16-slow/ladder@40", "mock/seqs4/shared-prefix"}}
	c.Base.Out = t.TempDir()
	cells, cfgs, err := c.plan()
	if err != nil {
		t.Fatal(err)
	}
	if len(cells) != 2 || cfgs[0].Rate != 40 || cfgs[0].Engine.MaxNumSeqs != 16 || cfgs[1].Family != fleet.FamilyMock {
		t.Fatalf("cells %+v", cells)
	}
	for _, bad := range []string{"llmd-sim/seqs4", "llmd-sim/huge/conversation", "mock/seqs4/ladder", "mock/seqs4/conversation@3", "mock/seqs4/nope"} {
		c.Cells = []string{bad}
		if _, _, err := c.plan(); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
