package admit

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/messages"
)

// newTestTickets keys tickets by a counter: the keys are the driver's
// (crypto/rand) in a node; what a ticket admits does not depend on them.
func newTestTickets() *Tickets {
	n := 0
	return NewTickets(func() string { n++; return fmt.Sprintf("key-%012d", n) })
}

func prepareFor(ticket []byte, rid string, gen uint64, address, fenceRid string) *messages.RelocationPrepare {
	return &messages.RelocationPrepare{MoveTicket: ticket,
		Source:   &messages.NodeRef{NodeRid: rid, NodeGeneration: gen, Address: address},
		Identity: &messages.RelocationIdentity{CoordinatorFence: &messages.CoordinatorFence{NodeRid: fenceRid, NodeGeneration: gen}}}
}

// A ticket admits one Restore request: from the node lifecycle and address
// it was issued to, naming that node's fence, once, before it expires.
func TestAMoveTicketIsBoundToItsSourceAndUsedOnce(t *testing.T) {
	ts, now := newTestTickets(), time.Now()
	b := ts.Issue("a", 1, "127.0.0.1:1", now)
	require.Len(t, b, 16)
	require.False(t, ts.Take(prepareFor(b, "a", 1, "127.0.0.1:2", "a"), "127.0.0.1:2", now), "another address")
	require.False(t, ts.Take(prepareFor(b, "c", 1, "127.0.0.1:1", "c"), "127.0.0.1:1", now), "another node")
	require.False(t, ts.Take(prepareFor(b, "a", 2, "127.0.0.1:1", "a"), "127.0.0.1:1", now), "another lifecycle")
	require.False(t, ts.Take(prepareFor(b, "a", 1, "127.0.0.1:1", "c"), "127.0.0.1:1", now), "another node's fence")
	require.False(t, ts.Take(prepareFor(b, "a", 1, "127.0.0.1:1", "a"), "127.0.0.1:1", now.Add(TicketTTL+time.Second)), "expired")
	require.True(t, ts.Take(prepareFor(b, "a", 1, "127.0.0.1:1", "a"), "127.0.0.1:1", now))
	require.False(t, ts.Take(prepareFor(b, "a", 1, "127.0.0.1:1", "a"), "127.0.0.1:1", now), "used")
}

// A flood of capability queries that claim one address keeps at most
// TicketsPerSource tickets for it, each issue costs O(1) amortized, and
// another source's ticket stays good; expired tickets go.
func TestTicketsAreBounded(t *testing.T) {
	ts, now := newTestTickets(), time.Now()
	other := ts.Issue("b", 1, "127.0.0.1:2", now) // a live head the flood's tickets queue behind
	for i := 0; i < 100_000; i++ {
		ts.Issue("a", 1, "127.0.0.1:1", now)
	}
	require.LessOrEqual(t, len(ts.order), 2*len(ts.byKey)+65, "removed keys do not pile up")
	require.Len(t, ts.bySource["127.0.0.1:1"], TicketsPerSource)
	require.LessOrEqual(t, len(ts.byKey), MaxTickets)
	require.True(t, ts.Take(prepareFor(other, "b", 1, "127.0.0.1:2", "b"), "127.0.0.1:2", now))
	ts.Issue("c", 1, "127.0.0.1:3", now.Add(TicketTTL+time.Second))
	require.Len(t, ts.byKey, 1, "every expired ticket went")
	require.LessOrEqual(t, len(ts.order), 1)
}
