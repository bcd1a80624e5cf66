package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/location"
)

// slotNode claims a node for the slot tests and returns its key and lease.
func slotNode(t *testing.T, s location.Store, h Harness, rid string) (location.NodeKey, location.LeaseID) {
	t.Helper()
	n := node(rid, "roam-entry-"+rid, 1)
	lease, err := s.ClaimNode(ctx(t), n, h.LeaseTTL)
	require.NoError(t, err)
	return location.NodeKeyOf(n), lease.ID
}

func requireSlots(t *testing.T, s location.Store, node location.NodeKey, want ...location.Slot) {
	t.Helper()
	got, err := s.ListSlots(ctx(t), node)
	require.NoError(t, err)
	if len(want) == 0 {
		require.Empty(t, got, "slots of %s", node)
		return
	}
	require.Equal(t, want, got, "slots of %s", node)
}

// A node takes free slots in the same transaction as a record, sets a
// pending one active, and frees them (an absent one too); ListSlots shows
// each holder and state in index order, and only the node's own slots.
func testSlotTakeSetFree(t *testing.T, h Harness) {
	s := open(t, h).Store
	nk, lease := slotNode(t, s, h, "rid-slots")
	other, _ := slotNode(t, s, h, "rid-slots-2") // a RID that rid-slots is a prefix of
	a := location.Key(location.KindActor, "slot-holder-a")
	b := location.Key(location.KindInstanceSpot, "slot holder/b é")

	versions, err := s.Apply(ctx(t), []location.Op{
		location.TakeSlotOp(nk, lease, 7, a, true),
		location.CreateOp(a, rec("a", 1)),
		location.TakeSlotOp(nk, lease, 2, b, false),
		location.CheckLeaseOp(nk, lease),
	})
	require.NoError(t, err)
	require.Len(t, versions, 4)
	require.Zero(t, versions[0], "a slot op has no version")
	require.NotZero(t, versions[1])
	require.Zero(t, versions[2])
	requireSlots(t, s, nk, location.Slot{Index: 2, Holder: b}, location.Slot{Index: 7, Holder: a, Pending: true})
	requireSlots(t, s, other)

	// Pending to active at the holder's commit; a slot set where none was.
	_, err = s.Apply(ctx(t), []location.Op{
		location.SetSlotOp(nk, lease, 7, a, false),
		location.SetSlotOp(nk, lease, 10, b, true),
	})
	require.NoError(t, err)
	requireSlots(t, s, nk, location.Slot{Index: 2, Holder: b}, location.Slot{Index: 7, Holder: a}, location.Slot{Index: 10, Holder: b, Pending: true})

	// Freeing a held slot and an absent one both succeed.
	versions, err = s.Apply(ctx(t), []location.Op{location.FreeSlotOp(nk, 2), location.FreeSlotOp(nk, 3)})
	require.NoError(t, err)
	require.Equal(t, []location.StoreVersion{0, 0}, versions)
	requireSlots(t, s, nk, location.Slot{Index: 7, Holder: a}, location.Slot{Index: 10, Holder: b, Pending: true})

	// A freed slot can be taken again.
	_, err = s.Apply(ctx(t), []location.Op{location.TakeSlotOp(nk, lease, 2, a, true)})
	require.NoError(t, err)
	requireSlots(t, s, nk, location.Slot{Index: 2, Holder: a, Pending: true}, location.Slot{Index: 7, Holder: a}, location.Slot{Index: 10, Holder: b, Pending: true})
}

// Taking a held slot fails the whole transaction as a conflict naming
// that op: the other ops beside it (a record, another slot) do not
// happen, and the held slot keeps its holder. A record conflict beside a
// take leaves the slot free.
func testSlotTakeHeld(t *testing.T, h Harness) {
	s := open(t, h).Store
	nk, lease := slotNode(t, s, h, "rid-slot-held")
	first := location.Key(location.KindActor, "slot-first")
	second := location.Key(location.KindActor, "slot-second")
	_, err := s.Apply(ctx(t), []location.Op{location.TakeSlotOp(nk, lease, 1, first, false)})
	require.NoError(t, err)

	_, err = s.Apply(ctx(t), []location.Op{
		location.CreateOp(second, rec("second", 1)),
		location.TakeSlotOp(nk, lease, 1, second, true),
		location.TakeSlotOp(nk, lease, 3, second, true),
		location.CheckLeaseOp(nk, lease),
	})
	c := requireConflict(t, err)
	require.Equal(t, []int{1}, c.FailedOps)
	require.NotErrorIs(t, err, location.ErrLeaseEnded)
	requireAbsent(t, s, second)
	requireSlots(t, s, nk, location.Slot{Index: 1, Holder: first})

	// A stale record version beside a take: the slot stays free.
	v, err := s.CompareAndSet(ctx(t), second, 0, rec("second", 1))
	require.NoError(t, err)
	_, err = s.Apply(ctx(t), []location.Op{
		location.TakeSlotOp(nk, lease, 4, second, true),
		location.UpdateOp(second, v+1000, rec("second", 2)),
	})
	c = requireConflict(t, err)
	require.Equal(t, []int{1}, c.FailedOps)
	cur, ok := c.CurrentOf(second)
	require.True(t, ok)
	require.Equal(t, v, cur.Version)
	requireSlots(t, s, nk, location.Slot{Index: 1, Holder: first})

	// The same take with the right version applies both.
	_, err = s.Apply(ctx(t), []location.Op{
		location.TakeSlotOp(nk, lease, 4, second, true),
		location.UpdateOp(second, v, rec("second", 2)),
	})
	require.NoError(t, err)
	requireSlots(t, s, nk, location.Slot{Index: 1, Holder: first}, location.Slot{Index: 4, Holder: second, Pending: true})
}

// A take or set under a lease that does not hold the node's descriptor
// (another node's, a node never claimed, a released one) fails the
// transaction with ErrLeaseEnded, not a conflict, and writes nothing.
func testSlotLeaseEnded(t *testing.T, h Harness) {
	s := open(t, h).Store
	na, la := slotNode(t, s, h, "rid-slot-la")
	nb, lb := slotNode(t, s, h, "rid-slot-lb")
	holder := location.Key(location.KindActor, "slot-fenced")
	none := location.NodeKey{Mesh: "mesh", NodeRid: "rid-slot-none"}
	for name, op := range map[string]location.Op{
		"take under another node's lease": location.TakeSlotOp(na, lb, 0, holder, true),
		"set under another node's lease":  location.SetSlotOp(na, lb, 0, holder, false),
		"take on a node never claimed":    location.TakeSlotOp(none, la, 0, holder, true),
	} {
		_, err := s.Apply(ctx(t), []location.Op{location.CreateOp(holder, rec("f", 1)), op})
		require.ErrorIs(t, err, location.ErrLeaseEnded, name)
		require.NotErrorIs(t, err, location.ErrConflict, name)
		requireAbsent(t, s, holder)
	}
	requireSlots(t, s, na)
	requireSlots(t, s, nb)
	requireSlots(t, s, none)

	// The lease ended by a release: its node can take no slot.
	desc, err := s.ReadNode(ctx(t), na)
	require.NoError(t, err)
	require.NoError(t, s.ReleaseNode(ctx(t), desc.Node))
	_, err = s.Apply(ctx(t), []location.Op{location.TakeSlotOp(na, la, 0, holder, false)})
	require.ErrorIs(t, err, location.ErrLeaseEnded)
	requireSlots(t, s, na)
}

// Slots are held by the node's lease: they are gone when it expires or
// the node is released, and the node's next lifecycle starts with none.
func testSlotsEndWithLease(t *testing.T, h Harness) {
	in := open(t, h)
	s := in.Store
	nk, lease := slotNode(t, s, h, "rid-slot-expire")
	rk, rlease := slotNode(t, s, h, "rid-slot-release")
	holder := location.Key(location.KindActor, "slot-expiring")
	_, err := s.Apply(ctx(t), []location.Op{
		location.TakeSlotOp(nk, lease, 0, holder, false),
		location.TakeSlotOp(nk, lease, 1, holder, true),
	})
	require.NoError(t, err)
	_, err = s.Apply(ctx(t), []location.Op{location.TakeSlotOp(rk, rlease, 0, holder, false)})
	require.NoError(t, err)

	desc, err := s.ReadNode(ctx(t), rk)
	require.NoError(t, err)
	require.NoError(t, s.ReleaseNode(ctx(t), desc.Node))
	requireSlots(t, s, rk)

	in.Pass(h.LeaseTTL + time.Second)
	eventually(t, h.Expiry+10*time.Second, "lease ends", func() bool {
		alive, err := s.LeaseAlive(ctx(t), lease)
		require.NoError(t, err)
		return !alive
	})
	eventually(t, 10*time.Second, "slots freed", func() bool {
		slots, err := s.ListSlots(ctx(t), nk)
		require.NoError(t, err)
		return len(slots) == 0
	})

	n2 := node("rid-slot-expire", "roam-entry-rid-slot-expire-2", 2)
	lease2, err := s.ClaimNode(ctx(t), n2, h.LeaseTTL)
	require.NoError(t, err)
	requireSlots(t, s, nk)
	_, err = s.Apply(ctx(t), []location.Op{location.TakeSlotOp(nk, lease2.ID, 0, holder, true)})
	require.NoError(t, err)
	requireSlots(t, s, nk, location.Slot{Index: 0, Holder: holder, Pending: true})
}

// Transactions racing to take one slot, each with a record of its own:
// exactly one applies, the others conflict and write nothing.
func testSlotRace(t *testing.T, h Harness) {
	s := open(t, h).Store
	nk, lease := slotNode(t, s, h, "rid-slot-race")
	const takers = 12
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		winners []int
		losers  int
		others  []error
	)
	key := func(i int) location.AuthorityKey {
		return location.Key(location.KindActor, fmt.Sprintf("slot-race-%d", i))
	}
	start := make(chan struct{})
	for i := 0; i < takers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := s.Apply(context.Background(), []location.Op{
				location.CreateOp(key(i), rec("r", 1)),
				location.TakeSlotOp(nk, lease, 5, key(i), true),
				location.CheckLeaseOp(nk, lease),
			})
			mu.Lock()
			defer mu.Unlock()
			var c *location.ConflictError
			switch {
			case err == nil:
				winners = append(winners, i)
			case errors.As(err, &c) && len(c.FailedOps) == 1 && c.FailedOps[0] == 1:
				losers++
			default:
				others = append(others, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	require.Empty(t, others)
	require.Len(t, winners, 1)
	require.Equal(t, takers-1, losers)
	requireSlots(t, s, nk, location.Slot{Index: 5, Holder: key(winners[0]), Pending: true})
	for i := 0; i < takers; i++ {
		if i != winners[0] {
			requireAbsent(t, s, key(i))
		}
	}
}

// Malformed slot ops are refused whole (ErrInvalid): two ops on one slot,
// a take or set without a lease or with an invalid holder, an invalid
// node. A take counts twice against MaxApplyOps (a check and a write),
// plus a lease check per (node, lease) no OpCheckLease makes: a
// transaction that counts exactly MaxApplyOps applies, one more is
// ErrTooLarge.
func testSlotOpsInvalid(t *testing.T, h Harness) {
	s := open(t, h).Store
	nk, lease := slotNode(t, s, h, "rid-slot-invalid")
	k := location.Key(location.KindActor, "slot-invalid")
	for name, ops := range map[string][]location.Op{
		"take twice":        {location.TakeSlotOp(nk, lease, 1, k, true), location.TakeSlotOp(nk, lease, 1, k, false)},
		"take and free":     {location.TakeSlotOp(nk, lease, 1, k, true), location.FreeSlotOp(nk, 1)},
		"set and free":      {location.FreeSlotOp(nk, 2), location.SetSlotOp(nk, lease, 2, k, false)},
		"take, no lease":    {location.TakeSlotOp(nk, "", 1, k, true)},
		"set, no lease":     {location.SetSlotOp(nk, "", 1, k, true)},
		"holder invalid":    {location.TakeSlotOp(nk, lease, 1, location.Key(location.KindActor, ""), true)},
		"holder kind":       {location.SetSlotOp(nk, lease, 1, location.Key(99, "x"), true)},
		"node invalid":      {location.FreeSlotOp(location.NodeKey{Mesh: "mesh"}, 1)},
		"take node empty":   {location.TakeSlotOp(location.NodeKey{NodeRid: "r"}, lease, 1, k, true)},
		"with record dup":   {location.CreateOp(k, rec("x", 1)), location.TakeSlotOp(nk, lease, 1, k, true), location.SetSlotOp(nk, lease, 1, k, true)},
		"unknown op kind":   {{Kind: 99, Node: nk, Slot: 1}},
		"lease check twice": {location.CheckLeaseOp(nk, lease), location.TakeSlotOp(nk, lease, 1, k, true), location.CheckLeaseOp(nk, lease)},
	} {
		_, err := s.Apply(ctx(t), ops)
		require.ErrorIs(t, err, location.ErrInvalid, name)
	}
	requireAbsent(t, s, k)
	requireSlots(t, s, nk)
	_, err := s.ListSlots(ctx(t), location.NodeKey{Mesh: "mesh"})
	require.ErrorIs(t, err, location.ErrInvalid)

	// 1 lease check + 63 takes (126) + 1 record = 128.
	full := []location.Op{location.CheckLeaseOp(nk, lease), location.CreateOp(k, rec("x", 1))}
	for i := 0; i < 63; i++ {
		full = append(full, location.TakeSlotOp(nk, lease, uint32(i), k, true))
	}
	require.Equal(t, location.MaxApplyOps, location.ApplyOpCount(full))
	over := append(append([]location.Op(nil), full...), location.FreeSlotOp(nk, 100))
	_, err = s.Apply(ctx(t), over)
	require.ErrorIs(t, err, location.ErrTooLarge)
	requireAbsent(t, s, k)
	requireSlots(t, s, nk)
	// Without the OpCheckLease the takes bring their own lease check.
	noCheck := append([]location.Op(nil), full[1:]...)
	require.Equal(t, location.MaxApplyOps, location.ApplyOpCount(noCheck))
	_, err = s.Apply(ctx(t), append(noCheck, location.FreeSlotOp(nk, 100)))
	require.ErrorIs(t, err, location.ErrTooLarge)

	_, err = s.Apply(ctx(t), full)
	require.NoError(t, err)
	slots, err := s.ListSlots(ctx(t), nk)
	require.NoError(t, err)
	require.Len(t, slots, 63)
	for i, sl := range slots {
		require.EqualValues(t, i, sl.Index)
	}
}
