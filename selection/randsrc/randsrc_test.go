package randsrc

import (
	"math/rand/v2"
	"regexp"
	"testing"
)

func TestUUIDIsAVersion4UUID(t *testing.T) {
	src := New(rand.New(rand.NewPCG(1, 2)))
	re := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for range 100 {
		id := src.UUID()
		if !re.MatchString(id) || seen[id] {
			t.Fatalf("UUID %q: not a fresh version-4 UUID", id)
		}
		seen[id] = true
	}
}

func TestSeededSourcesDrawTheSame(t *testing.T) {
	a, b := New(rand.New(rand.NewPCG(7, 8))), New(rand.New(rand.NewPCG(7, 8)))
	if a.UUID() != b.UUID() || a.Child().Uint64() != b.Child().Uint64() || a.ReplicaID() != b.ReplicaID() {
		t.Fatal("two sources of one seed drew differently")
	}
	if id := a.ReplicaID(); id == 0 || a.ReplicaID() != id {
		t.Fatalf("replica id %d: want one non-zero id", id)
	}
}
