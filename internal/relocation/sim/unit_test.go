package sim

import (
	"slices"
	"testing"
)

// The unit checks read the store: a Spot's record that miscounts its
// members, and a member's record that names another owner, are each
// reported.
func TestUnitChecksCatch(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Members = []int{2}
	w := NewWorld(cfg, 1, nil)
	w.checkUnits()
	if vs := w.Violations(); len(vs) != 0 {
		t.Fatalf("a whole unit: %v", vs)
	}
	w.store.recs[0].MemberCount = 1
	w.store.recs[2].OwnerNode = "n2"
	w.checkUnits()
	var got []string
	for _, v := range w.Violations() {
		got = append(got, v.Invariant)
	}
	if !slices.Contains(got, "member-count") || !slices.Contains(got, "unit-split") {
		t.Fatalf("violations %v, want member-count and unit-split", got)
	}
}
