package simkit

import (
	"fmt"
	"testing"
)

// Each profile draws what its number promised the fault generators when
// they wrote it out: 0 none, 1 the store, 2 the network, 3 the nodes, 4
// all thinly, 5 all.
func TestProfiles(t *testing.T) {
	kinds := func(p Profile) string {
		return fmt.Sprint(p.StoreAnswers(), p.Packets(), p.Crashes(), p.Thin(), p.LinkCuts(), p.StoreOutages(), p.NodeFaults())
	}
	for p, want := range []string{
		"false false false false false false false",
		"true false false false false true false",
		"false true false false true false false",
		"false false true false true false true",
		"false false false true true true true",
		"true true true false true true true",
	} {
		if got := kinds(Profile(p)); got != want {
			t.Errorf("profile %d: %s, want %s", p, got, want)
		}
	}
	h, r := NewHarness(3, 1), NewRand(3, 1)
	for range 50 {
		if got, want := h.DrawProfile(), Profile(r.IntN(6)); got != want {
			t.Fatalf("drew profile %d, want %d (one IntN(6) from the schedule's source)", got, want)
		}
	}
}
