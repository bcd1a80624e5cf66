package main

import (
	"context"
	"testing"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
)

// The drain scenario runs and loses nothing (the figures are make bench's).
func TestDrainScenarioLosesNothing(t *testing.T) {
	row, err := drainNode(context.Background(), func() (location.Store, error) { return memstore.New(), nil }, 300, 1, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", row)
	if row.Moved != 300 || row.Failed != 0 || row.Lost != 0 {
		t.Fatalf("drain: %+v", row)
	}
	if row.StoppedLost != 300 {
		t.Fatalf("a node simply stopped lost %d of 300, want all", row.StoppedLost)
	}
}

// The SpotWide scenario runs: every move is one unit with one pause.
func TestSpotWideScenarioRuns(t *testing.T) {
	row, err := spotWidePause(context.Background(), func() (location.Store, error) { return memstore.New(), nil }, 5, 1<<10, 1, 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", row)
	if row.Moves != 4 {
		t.Fatalf("%d pauses for 4 moves of one unit", row.Moves)
	}
}
