// Package handoff is the pure hand-off state machine (docs/PROTOCOL.md §5):
// events in, a phase and effects out. It has no goroutines, no clock and no
// network; the relocation driver runs the effects against the mailbox, the
// remote and the Location Store and feeds their results back as events, the
// way etcd's raft separates its core from I/O (PROTOCOL.md §1).
//
// Each relocation unit has a Source machine on the node it leaves and a
// Target machine on the node it moves to. Their phases are those of
// PROTOCOL.md §6.7. The backward edges go to SourceRunning: from
// SourcePaused on an explicit failure reply before relay-ready is accepted
// (or a fence-out of a silent target), and from FollowOnly when a target
// that never committed after the cutover is fenced out (PROTOCOL.md §6.5,
// docs/FAULTS.md).
package handoff

import "fmt"

// Phase is a step of a move (PROTOCOL.md §6.7).
type Phase int

// The phases, in the order of PROTOCOL.md §6.7.
const (
	// SourceRunning: the object serves normally on the source.
	SourceRunning Phase = iota + 1
	// SourcePaused: the current turn finished, dispatch stopped, state,
	// saved work and timers captured, the payload on its way
	// (PROTOCOL.md §5.2–§5.6).
	SourcePaused
	// TargetRestoring: the target installed its temporary queue and is
	// assembling and restoring the payload (PROTOCOL.md §5.7).
	TargetRestoring
	// RelayReady: the target replied relay-ready; on the source, its
	// acceptance ends the source's own restore on an explicit failure
	// (PROTOCOL.md §6.1).
	RelayReady
	// CutoverReceived: the cutover arrived with a matching count and CRC.
	CutoverReceived
	// CutoverFallback: no cutover within RelocationCutoverWaitTimeout.
	CutoverFallback
	// StoreRetry: the CAS met a retryable or indeterminate answer
	// (PROTOCOL.md §5.11).
	StoreRetry
	// OwnerCommitted: the target-only CAS made the target the owner.
	OwnerCommitted
	// TargetRemoved: the target gave up (conflict, stale, deadline, failure)
	// and removed what it prepared.
	TargetRemoved
	// TargetOpen: backlog merged and dispatch opened on the target
	// (PROTOCOL.md §5.12).
	TargetOpen
	// FollowOnly: the source holds, then only forwards, late messages
	// (PROTOCOL.md §5.13, §5.14).
	FollowOnly
)

var phaseNames = map[Phase]string{
	SourceRunning:   "SourceRunning",
	SourcePaused:    "SourcePaused",
	TargetRestoring: "TargetRestoring",
	RelayReady:      "RelayReady",
	CutoverReceived: "CutoverReceived",
	CutoverFallback: "CutoverFallback",
	StoreRetry:      "StoreRetry",
	OwnerCommitted:  "OwnerCommitted",
	TargetRemoved:   "TargetRemoved",
	TargetOpen:      "TargetOpen",
	FollowOnly:      "FollowOnly",
}

func (p Phase) String() string {
	if n, ok := phaseNames[p]; ok {
		return n
	}
	return fmt.Sprintf("Phase(%d)", int(p))
}

// transitions lists every edge a machine may take. A machine that would take
// another edge panics: that is a bug in this package, never an input error.
var transitions = map[Phase][]Phase{
	SourceRunning: {SourcePaused},
	// SourceRunning is a backward edge (FollowOnly → SourceRunning, a
	// fence-out, is the other); FollowOnly is reached from
	// SourcePaused only when reconciliation finds the target committed
	// after its relay-ready reply was lost (PROTOCOL.md §6.4).
	SourcePaused: {SourceRunning, RelayReady, FollowOnly},
	// RelayReady → FollowOnly is the source's cutover; → TargetRemoved is
	// the target's restore deadline passing before the cutover wait ends.
	RelayReady:      {FollowOnly, CutoverReceived, CutoverFallback, TargetRemoved},
	TargetRestoring: {RelayReady, TargetRemoved},
	CutoverReceived: {OwnerCommitted, StoreRetry, TargetRemoved},
	CutoverFallback: {OwnerCommitted, StoreRetry, TargetRemoved},
	StoreRetry:      {OwnerCommitted, TargetRemoved},
	OwnerCommitted:  {TargetOpen},
	// FollowOnly → SourceRunning: the move was fenced out after the
	// cutover (the target never committed and now never can); the source
	// serves again from what it held (PROTOCOL.md §6.5, docs/FAULTS.md).
	FollowOnly: {SourceRunning},
}

// Allowed reports whether from → to is an edge of PROTOCOL.md §6.7.
func Allowed(from, to Phase) bool {
	for _, p := range transitions[from] {
		if p == to {
			return true
		}
	}
	return false
}

func mustMove(from, to Phase) Phase {
	if !Allowed(from, to) {
		panic(fmt.Sprintf("handoff: illegal transition %s → %s", from, to))
	}
	return to
}
