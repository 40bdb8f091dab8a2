package decisionlog

import "testing"

func TestLogIsBounded(t *testing.T) {
	l := New(3)
	for i := range 5 {
		l.Add(Record{WorkerID: uint64(i)})
	}
	var ids []uint64
	for _, r := range l.Latest(0) {
		ids = append(ids, r.WorkerID)
	}
	if len(ids) != 3 || ids[0] != 4 || ids[2] != 2 {
		t.Errorf("kept %v, want the newest three, newest first", ids)
	}
	if got := l.Latest(2); len(got) != 2 || got[0].WorkerID != 4 {
		t.Errorf("Latest(2) = %+v", got)
	}
	if New(-1).Latest(0) != nil {
		t.Error("a disabled log returned records")
	}
}
