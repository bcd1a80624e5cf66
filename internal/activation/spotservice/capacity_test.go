package spotservice

import (
	"errors"
	"testing"

	"github.com/roamactors/roam/roamerr"
)

// A node admits a creation while what it serves plus what it creates
// stays within its Capacity (0: unbounded), and none while it drains.
// Reference: docs/PROTOCOL.md §7.2.
func TestAdmitCapacity(t *testing.T) {
	for _, tc := range []struct {
		name              string
		draining          bool
		capacity          uint32
		serving, creating int
		want              error
	}{
		{"unbounded", false, 0, 1000, 1000, nil},
		{"room for one", false, 3, 1, 1, nil},
		{"full by serving", false, 3, 3, 0, roamerr.ErrCapacityExceeded},
		{"full by creations", false, 3, 1, 2, roamerr.ErrCapacityExceeded},
		{"draining, unbounded", true, 0, 0, 0, roamerr.ErrNodeDraining},
		{"draining, room", true, 3, 0, 0, roamerr.ErrNodeDraining},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := AdmitCapacity("n1", tc.draining, tc.capacity, tc.serving, tc.creating)
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("AdmitCapacity = %v, want %v", err, tc.want)
			}
			if tc.want == roamerr.ErrNodeDraining && !errors.Is(err, roamerr.ErrUnavailable) {
				t.Fatalf("a draining node's refusal %v is not Unavailable", err)
			}
		})
	}
}

// Only a bounded node that is not draining counts its creations in
// progress. Reference: docs/PROTOCOL.md §7.2.
func TestHoldsSlot(t *testing.T) {
	for _, tc := range []struct {
		draining bool
		capacity uint32
		want     bool
	}{{false, 0, false}, {false, 3, true}, {true, 3, false}, {true, 0, false}} {
		if got := HoldsSlot(tc.draining, tc.capacity); got != tc.want {
			t.Errorf("HoldsSlot(%v, %d) = %v, want %v", tc.draining, tc.capacity, got, tc.want)
		}
	}
}
