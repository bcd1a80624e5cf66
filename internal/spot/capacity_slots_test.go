package spot_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/spot"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// slotsAgree checks a node's capacity slots against the records: every
// object the node lifecycle owns holds a slot of its own that its record
// names, every held slot is such an object's, and there are at most
// capacity of them (PROTOCOL.md §7.12). It returns how many it holds.
func slotsAgree(t *testing.T, store location.Store, e *extension.Extension, capacity int) int {
	t.Helper()
	n, why := slotsMatch(t, store, e, capacity)
	require.Empty(t, why)
	return n
}

// slotsMatch is slotsAgree's check: what does not agree ("" when all does).
func slotsMatch(t *testing.T, store location.Store, e *extension.Extension, capacity int) (int, string) {
	t.Helper()
	desc := e.Node().Descriptor()
	node := location.NodeKey{Mesh: desc.GetMesh(), NodeRid: desc.GetNodeRid()}
	slots, err := store.ListSlots(ctx, node)
	require.NoError(t, err)
	if len(slots) > capacity {
		return len(slots), fmt.Sprintf("node %s holds %d slots, more than its capacity %d: %v", node.NodeRid, len(slots), capacity, slots)
	}
	held := map[location.AuthorityKey]uint32{}
	for _, s := range slots {
		if s.Index >= uint32(capacity) {
			return len(slots), fmt.Sprintf("slot %d is past the capacity %d", s.Index, capacity)
		}
		if _, dup := held[s.Holder]; dup {
			return len(slots), fmt.Sprintf("%s holds two slots: %v", s.Holder, slots)
		}
		held[s.Holder] = s.Index
	}
	owned := map[location.AuthorityKey]uint32{}
	for _, kind := range []location.Kind{location.KindActor, location.KindInstanceSpot, location.KindUserSpot} {
		page, err := store.List(ctx, kind, location.PageRequest{Size: location.MaxPageSize})
		require.NoError(t, err)
		for _, v := range page.Items {
			if v.Record.GetOwner().GetNodeRid() != node.NodeRid {
				continue
			}
			slot, ok := relocation.RecordSlot(v.Record)
			if !ok {
				return len(slots), fmt.Sprintf("%s is owned by a node of capacity %d but names no slot", v.Key, capacity)
			}
			owned[v.Key] = slot
		}
	}
	if fmt.Sprint(owned) != fmt.Sprint(held) {
		return len(slots), fmt.Sprintf("node %s: the records name slots %v, the store holds %v", node.NodeRid, owned, held)
	}
	return len(slots), ""
}

// Capacity lives in the store: an Actor's spawn, a cold activation, a
// User Spot created from another node, a move in and out, a close and a
// delete each take or free the node's slot in the transaction that writes
// the record, so the slots a node holds are always its objects'.
// Reference: docs/PROTOCOL.md §7.12.
func TestCapacitySlotsFollowEveryWrite(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		const capacity = 10 // more than the test places: no write here finds a node full
		a := w.start(withCapacity(capacity))
		b := w.start(withCapacity(capacity))
		c := w.start() // unbounded: takes no slots
		check := func() {
			t.Helper()
			slotsAgree(t, store, a, capacity)
			slotsAgree(t, store, b, capacity)
		}

		_, err := a.SpawnActor(ctx, "cart", "actor-1")
		require.NoError(t, err)
		_, err = a.SpawnActor(ctx, "cart", "actor-2")
		require.NoError(t, err)
		check()

		// Cold activations and creations asked from the unbounded node land
		// wherever placement puts them; every one on a or b holds a slot.
		for i := range 3 {
			_, err := request(t, c, fmt.Sprintf("cart-%d", i), "x", "cart")
			require.NoError(t, err)
			res, err := c.Spots().GetOrCreate(fmt.Sprintf("room-%d", i), "room").Do(ctx)
			require.NoError(t, err)
			require.Equal(t, spot.Created, res.State)
		}
		check()

		// Moves: out of a to the unbounded node, into b, back into a.
		_, err = a.Relocate(ctx, extension.ActorRef("actor-1"), c.NodeRid())
		require.NoError(t, err)
		check()
		_, err = c.Relocate(ctx, extension.ActorRef("actor-1"), b.NodeRid())
		require.NoError(t, err)
		check()
		_, err = b.Relocate(ctx, extension.ActorRef("actor-1"), a.NodeRid())
		require.NoError(t, err)
		check()

		// A delete and a close free theirs.
		deleted, err := a.DeleteActor(ctx, extension.ActorRef("actor-2"))
		require.NoError(t, err)
		require.True(t, deleted)
		check()
		for i := range 3 {
			ref, err := c.Spots().Find(ctx, fmt.Sprintf("room-%d", i))
			require.NoError(t, err)
			closed, err := c.Spots().Close(ctx, ref)
			require.NoError(t, err)
			require.True(t, closed)
		}
		check()
	})
}

// A move into a node whose slots are all held fails CapacityExceeded
// before anything commits, and the object serves on at its source with its
// state; concurrent moves into a node never take more than its capacity.
// Reference: docs/PROTOCOL.md §7.12.
func TestMovesIntoANodeStopAtItsCapacity(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		const capacity = 3
		a := w.start(withCapacity(capacity))
		b := w.start()
		const actors = 8
		for i := range actors {
			_, err := b.SpawnActor(ctx, "cart", fmt.Sprintf("mover-%d", i))
			require.NoError(t, err)
		}
		var wg sync.WaitGroup
		errs := make([]error, actors)
		for i := range actors {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = b.Relocate(ctx, extension.ActorRef(fmt.Sprintf("mover-%d", i)), a.NodeRid())
			}()
		}
		wg.Wait()
		moved := 0
		for i, err := range errs {
			if err == nil {
				moved++
				continue
			}
			require.ErrorIs(t, err, roamerr.ErrCapacityExceeded, "mover-%d", i)
			v, rerr := store.Read(ctx, extension.ActorRef(fmt.Sprintf("mover-%d", i)))
			require.NoError(t, rerr)
			require.Equal(t, b.NodeRid(), v.Record.GetOwner().GetNodeRid(), "mover-%d stays at its source", i)
		}
		require.Positive(t, moved)
		require.LessOrEqual(t, moved, capacity)
		require.Equal(t, moved, slotsAgree(t, store, a, capacity))

		// Full now or not, fill it and try once more: refused, and the
		// Actor left behind still answers at its source.
		for i := 0; slotsAgree(t, store, a, capacity) < capacity; i++ {
			_, err := a.SpawnActor(ctx, "cart", fmt.Sprintf("filler-%d", i))
			require.NoError(t, err)
		}
		_, err := a.SpawnActor(ctx, "cart", "one-too-many")
		require.ErrorIs(t, err, roamerr.ErrCapacityExceeded)
		var left string
		for i, err := range errs {
			if err != nil {
				left = fmt.Sprintf("mover-%d", i)
			}
		}
		if left != "" {
			_, err = b.Relocate(ctx, extension.ActorRef(left), a.NodeRid())
			require.ErrorIs(t, err, roamerr.ErrCapacityExceeded)
			pid, err := b.Resolve(ctx, extension.ActorRef(left))
			require.NoError(t, err)
			_, err = b.System().Root.RequestFuture(pid, wrapperspb.String("still here"), testwait.Patience(t)).Result()
			require.NoError(t, err, "%s answers at its source", left)
		}
		slotsAgree(t, store, a, capacity)
	})
}

// Creations placed on one node by several others at once race for its
// slots in the store (each reservation takes a pending slot of the
// target): never more than its capacity are created, the losers end
// CapacityExceeded, and the node's slots are its Spots'.
// Reference: docs/PROTOCOL.md §7.12, §7.2 (the reservation fence).
func TestRemoteCreationsRaceForTheTargetsSlots(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		const capacity = 2
		a := w.start(withCapacity(capacity)) // the only node hosting rooms
		b := w.start(withKinds(w.cartKind("cart")))
		c := w.start(withKinds(w.cartKind("cart")))
		const creates = 12
		errs := make([]error, creates)
		var wg sync.WaitGroup
		for i := range creates {
			wg.Add(1)
			go func() {
				defer wg.Done()
				from := []*extension.Extension{b, c}[i%2]
				_, errs[i] = from.Spots().GetOrCreate(fmt.Sprintf("race-%d", i), "room").Do(ctx)
			}()
		}
		wg.Wait()
		created := 0
		for i, err := range errs {
			if err == nil {
				created++
				continue
			}
			require.ErrorIs(t, err, roamerr.ErrCapacityExceeded, "race-%d", i)
		}
		require.Positive(t, created)
		require.LessOrEqual(t, created, capacity)
		require.Equal(t, created, recordCount(t, store, location.KindUserSpot))
		require.Equal(t, created, slotsAgree(t, store, a, capacity))
	})
}
