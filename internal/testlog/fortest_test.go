package testlog

import (
	"fmt"
	"testing"
)

// The ring keeps the last lines in order and counts what it let go.
func TestRingKeepsTheLastLines(t *testing.T) {
	r := &ring{}
	for i := range keep + 3 {
		fmt.Fprintf(r, "line %d\n", i)
	}
	lines, dropped := r.snapshot()
	if dropped != 3 || len(lines) != keep || lines[0] != "line 3" || lines[keep-1] != fmt.Sprintf("line %d", keep+2) {
		t.Fatalf("kept %d lines from %q to %q, dropped %d", len(lines), lines[0], lines[len(lines)-1], dropped)
	}
}
