package spot_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/meshnode/lease"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/faulty"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/roamerr"
)

// A node cut off from the store (its process alive, its peers reachable)
// stops serving before its lease can end, so when another node reactivates
// its Instance Spot the two incarnations never both handle messages: in the
// one global order of handled messages, everything the cut-off incarnation
// handled comes before anything the new one handled, and no message is
// handled twice. After the cut heals the old node learns its lease ended,
// never handles anything again, and its handle answers Unavailable.
// Reference: docs/PROTOCOL.md §3.4 (ended owners), §7.10 (reactivation),
// and PROTOCOL.md §10 (one owner at a time).
func TestCutOffNodeStopsServingBeforeItsSpotIsReactivated(t *testing.T) {
	onBothStoresInLogicalTime(t, func(t *testing.T, w *world) {
		store := w.store
		f, err := faulty.New(store, faulty.Config{})
		require.NoError(t, err)
		a := w.start(withStore(f))
		b := w.start()
		ctx := context.Background()
		id := "fenced-cart"
		_, err = a.SpawnInstanceSpot(ctx, "cart", id)
		require.NoError(t, err)
		_, err = b.Spots().Request(id, wrapperspb.String("before")).InstanceSpot().Do(ctx)
		require.NoError(t, err)

		oldSpots, oldNode := a.Spots(), a.Node()
		// The instant the store is first seen to have ended a's lease: from
		// then on another node may own a's objects, so a must have handled
		// nothing after it. On real time a watcher polls; in logical time
		// the lease ends only as the clock moves, so the store is asked
		// after every step, and the last instant it was seen to hold the
		// lease is the bound (the clock passes instants within a step).
		var (
			aliveMu            sync.Mutex
			lastAlive, endedAt time.Time
			ended              bool
		)
		leaseSeen := func() {
			now := w.now()
			alive, err := store.LeaseAlive(ctx, oldNode.Lease().ID)
			aliveMu.Lock()
			defer aliveMu.Unlock()
			if err == nil && !ended {
				if alive {
					lastAlive = now
				} else {
					ended, endedAt = true, w.now()
				}
			}
		}
		watched := make(chan struct{})
		if w.clock == nil {
			go func() {
				defer close(watched)
				for {
					leaseSeen()
					aliveMu.Lock()
					done := ended
					aliveMu.Unlock()
					if done {
						return
					}
					time.Sleep(5 * time.Millisecond)
				}
			}()
		} else {
			close(watched)
		}
		leaseSeen()
		w.partition(f, true)
		var (
			mu      sync.Mutex
			untyped []error
			served  = map[string]bool{}
		)
		call := func(from *extension.Extension, v string) error {
			_, err := from.Spots().Request(id, wrapperspb.String(v)).InstanceSpot().Timeout(time.Second).Do(ctx)
			if err != nil && !typed(err) {
				mu.Lock()
				untyped = append(untyped, err)
				mu.Unlock()
			}
			if err == nil {
				mu.Lock()
				served[v] = true
				mu.Unlock()
			}
			return err
		}
		// Calls through b go on until the Spot is served again, by b: the
		// store ends a's lease, and the next Instance-intent call
		// reactivates the Spot on the live node. In logical time the
		// clock moves a step after each call, on real time the calls
		// wait for time to pass.
		servedByB := func() bool {
			w.mu.Lock()
			defer w.mu.Unlock()
			return len(w.trace) > 0 && strings.HasPrefix(w.trace[len(w.trace)-1].incarnation, b.Node().Address())
		}
		i := 0
		w.eventually(t, "the Spot served again", func() bool {
			if w.clock != nil {
				leaseSeen()
			}
			if servedByB() {
				return true
			}
			v := fmt.Sprintf("during-%d", i)
			// A call the fenced node holds ends at its deadline, on the
			// world's clock.
			if await(t, w, "the call "+v, func() error { return call(b, v) }) != nil && w.clock == nil {
				time.Sleep(10 * time.Millisecond) // the client's retry pace
			}
			i++
			return servedByB()
		})
		// A caller that still holds a route to the old incarnation (a
		// stale cache, a message in flight) reaches the cut-off node: it
		// must not handle it, and once the node learns its lease ended the
		// caller gets a typed failure.
		w.mu.Lock()
		old := w.trace[0].incarnation
		w.mu.Unlock()
		slash := strings.Index(old, "/")
		stale := b.System().Root.RequestFuture(actor.NewPID(old[:slash], old[slash+1:]), wrapperspb.String("stale-route"), time.Minute)
		w.partition(f, false)
		type result struct {
			res any
			err error
		}
		r := await(t, w, "the stale route's answer", func() result {
			res, err := stale.Result()
			return result{res, err}
		})
		require.NoError(t, r.err)
		require.ErrorIs(t, relocation.DeliveryError(r.res), roamerr.ErrUnavailable, "the old incarnation answered %v", r.res)
		w.eventually(t, "the cut-off node learns its lease ended", func() bool {
			select {
			case <-oldNode.LeaseLost():
				return true
			default:
				return false
			}
		})
		for i := 0; i < 20; i++ {
			require.NoError(t, call(b, fmt.Sprintf("after-%d", i)))
		}
		_, err = oldSpots.Request(id, wrapperspb.String("through-the-old-handle")).Do(ctx)
		require.ErrorIs(t, err, roamerr.ErrUnavailable, "the Spot manager of a lifecycle whose lease ended answers Unavailable")

		w.mu.Lock()
		trace := append([]handling(nil), w.trace...)
		w.mu.Unlock()
		mu.Lock()
		defer mu.Unlock()
		require.Empty(t, untyped)
		seen := map[string]bool{}
		var incarnations []string
		for _, h := range trace {
			require.False(t, seen[h.value], "%s handled twice", h.value)
			seen[h.value] = true
			if len(incarnations) == 0 || incarnations[len(incarnations)-1] != h.incarnation {
				require.NotContains(t, incarnations, h.incarnation, "incarnation %s handled again after another one did: two owners overlapped (trace %v)", h.incarnation, trace)
				incarnations = append(incarnations, h.incarnation)
			}
		}
		require.Len(t, incarnations, 2, "the cut-off incarnation, then the reactivated one")
		<-watched
		aliveMu.Lock()
		defer aliveMu.Unlock()
		require.True(t, ended, "the store never ended the cut-off node's lease")
		for _, h := range trace {
			if h.incarnation != incarnations[0] {
				continue
			}
			if w.clock != nil {
				require.False(t, h.at.After(lastAlive), "the cut-off node handled %s %s after the store was last seen to hold its lease", h.value, h.at.Sub(lastAlive))
			} else {
				require.True(t, h.at.Before(endedAt), "the cut-off node handled %s %s after the store ended its lease", h.value, h.at.Sub(endedAt))
			}
		}
		for v := range served {
			require.True(t, seen[v], "%s answered but never handled", v)
		}
	})
}

// A node whose lease ended while it was cut off from the store serves
// again by itself once the store is back: a new lifecycle (new node RID
// and generation, its own descriptor and Entry Spot) that takes new work,
// while its former objects were recovered elsewhere. In logical time the
// rejoin is work the node does at once, as on real time: the world's
// clock does not move from the old lease's end to the new lifecycle's
// claim. It used to move on while the rejoin's goroutine waited for the
// CPU, until the claim's own deadline on the clock had passed and the
// test gave up before the rejoin's retry.
// Reference: PROTOCOL.md §2.2 (every start is a new lifecycle), §7.10.
func TestCutOffNodeRejoinsAsANewLifecycle(t *testing.T) {
	onBothStoresInLogicalTime(t, func(t *testing.T, w *world) {
		store := w.store
		var inner location.Store = store
		var claims *claimTimes
		if ms, ok := store.(*memstore.Store); ok && w.clock != nil {
			claims = &claimTimes{Store: ms, now: w.now}
			inner = claims
		}
		f, err := faulty.New(inner, faulty.Config{})
		require.NoError(t, err)
		rejoined := make(chan struct{}, 1)
		a := w.start(withStore(f), func(c *extension.Config) {
			c.OnRejoin = func(*extension.Extension) { rejoined <- struct{}{} }
		})
		var endedMu sync.Mutex
		var endedAt time.Time
		a.Node().OnLeaseChange(func(s lease.Status) {
			if s == lease.Ended {
				endedMu.Lock()
				endedAt = w.now()
				endedMu.Unlock()
			}
		})
		b := w.start()
		ctx := context.Background()
		old := a.Node().Descriptor()
		_, err = a.SpawnInstanceSpot(ctx, "cart", "wanderer")
		require.NoError(t, err)

		w.partition(f, true)
		w.eventually(t, "the store ends the cut-off node's lease", func() bool {
			alive, err := store.LeaseAlive(ctx, location.LeaseID(old.GetLeaseId()))
			return err == nil && !alive
		})
		// Revoked by the live node, which watched the heartbeat stand
		// still for a TTL, the owner is ended at once. Ended by the store,
		// the live node takes the Spot over only once it has seen the
		// owner's descriptor gone for a lease TTL (the store may end a
		// lease early); until then calls answer Unavailable.
		_, rerr := store.ReadNode(ctx, location.NodeKeyOf(old))
		// A call the fenced node holds ends at its deadline, on the world's
		// clock.
		callElsewhere := func() error {
			return await(t, w, "a call to the Spot", func() error {
				_, err := b.Spots().Request("wanderer", wrapperspb.String("elsewhere")).InstanceSpot().Do(ctx)
				return err
			})
		}
		err = callElsewhere()
		if !errors.Is(rerr, location.ErrLeaseRevoked) {
			require.ErrorIs(t, err, roamerr.ErrUnavailable, "taken over as soon as the descriptor was seen gone")
		}
		w.eventually(t, "the Spot is reactivated on the live node", func() bool { return callElsewhere() == nil })
		w.partition(f, false)
		w.eventually(t, "the node rejoined", func() bool {
			select {
			case <-rejoined:
				return true
			default:
				return false
			}
		})
		if claims != nil {
			endedMu.Lock()
			ended := endedAt
			endedMu.Unlock()
			rejoinClaims := claims.since(1) // the first is the old lifecycle's
			require.NotEmpty(t, rejoinClaims)
			for _, at := range rejoinClaims {
				require.True(t, at.Equal(ended), "the world's clock moved %v while the node rejoined, from its old lease's end to its claim", at.Sub(ended))
			}
		}
		now := a.Node().Descriptor()
		require.NotEqual(t, old.GetNodeRid(), now.GetNodeRid())
		require.NotEqual(t, old.GetEntrySpotId(), now.GetEntrySpotId())
		require.True(t, a.Node().Valid())
		got, err := store.ReadNode(ctx, location.NodeKeyOf(now))
		require.NoError(t, err)
		require.Equal(t, now.GetNodeGeneration(), got.Node.GetNodeGeneration())

		// The new lifecycle takes work: a Spot spawned there answers calls
		// from the other node, and calls through its handle work again.
		_, err = a.SpawnInstanceSpot(ctx, "cart", "newcomer")
		require.NoError(t, err)
		_, err = b.Spots().Request("newcomer", wrapperspb.String("hello")).Do(ctx)
		require.NoError(t, err)
		_, err = a.Spots().Request("wanderer", wrapperspb.String("from the new lifecycle")).Do(ctx)
		require.NoError(t, err)
		v, err := store.Read(ctx, location.Key(location.KindInstanceSpot, "wanderer"))
		require.NoError(t, err)
		require.Equal(t, b.NodeRid(), v.Record.GetOwner().GetNodeRid(), "the recovered Spot stays where it was reactivated")
	})
}

// A node cut off from the store is taken for ended by the others a lease
// TTL after its heartbeat stood still, whenever the store itself would end
// its lease (here never: the store's clock does not move, as a Consul that
// takes twice the TTL would not yet have): the live node revokes its
// lease at the descriptor version it watched, so the cut-off node — fenced
// by then — can never serve again, and its stateful Spot comes back on the
// live node from its checkpoint, without a call. Nothing was handled by
// both.
// Reference: docs/FAULTS.md, "Lease fencing" (other nodes take over a TTL
// after the last heartbeat).
func TestSilentNodesLeaseIsRevokedAndItsObjectsRecovered(t *testing.T) {
	// The nodes in logical time; the store's leases on a clock of its
	// own, which never moves.
	store := memstore.New(memstore.WithClock(memstore.NewManualClock()))
	w := newLogicalWorldOn(t, machine.NewManualAt(time.Now()), store)
	vault := w.cartKind("vault")
	vault.ReactivateEmpty = false
	vault.CheckpointEvery = 1
	f, err := faulty.New(store, faulty.Config{})
	require.NoError(t, err)
	cut := w.start(withStore(f), withKinds(vault))
	live := w.start(withKinds(w.roomKind()))
	for _, v := range []string{"1", "2"} {
		_, err := request(t, live, "safe", v, "vault")
		require.NoError(t, err)
	}
	rescuer := w.start(withKinds(vault))
	w.eventually(t, "both captures checkpointed", func() bool { return storedCount(t, store, "safe") == 2 })
	require.Equal(t, cut.NodeRid(), ownerRid(t, store, "safe"))

	w.partition(f, true)
	w.eventually(t, "the cut-off node's lease revoked and its Spot recovered on the live node", func() bool {
		return ownerRid(t, store, "safe") == rescuer.NodeRid()
	})
	_, err = store.ReadNode(ctx, location.NodeKey{Mesh: cut.Node().Descriptor().GetMesh(), NodeRid: cut.NodeRid()})
	require.ErrorIs(t, err, location.ErrLeaseRevoked, "ended by revocation, not by the store's clock")
	// A route the caller cached to the cut-off node may still take the
	// first try there, where it is not run (the node is fenced, and fails
	// what it holds once it learns its lease ended): Unavailable, retried.
	var n int64
	w.eventually(t, "the call served by the recovered Spot", func() bool {
		n, err = await(t, w, "a call", func() result[int64] { return resultOf(request(t, live, "safe", "3", "vault")) }).get()
		if err != nil {
			require.ErrorIs(t, err, roamerr.ErrUnavailable)
			return false
		}
		return true
	})
	require.EqualValues(t, 3, n, "from its checkpoint")
	w.partition(f, false)
	w.eventually(t, "the cut-off node learns its lease was revoked", received(cut.Node().LeaseLost()))
	require.Equal(t, []string{"1", "2", "3"}, w.handledOf("safe"), "nothing handled twice, nothing by the cut-off node after the cut")
}

// ownerRid is the node RID that owns Instance Spot id.
func ownerRid(t *testing.T, store location.Store, id string) string {
	t.Helper()
	v, err := store.Read(ctx, location.Key(location.KindInstanceSpot, id))
	require.NoError(t, err)
	return v.Record.GetOwner().GetNodeRid()
}

// claimTimes is a memstore that notes the world's time of every node
// claim made through it.
type claimTimes struct {
	*memstore.Store
	now func() time.Time
	mu  sync.Mutex
	at  []time.Time
}

func (c *claimTimes) ClaimNode(ctx context.Context, node *location.NodeDescriptor, ttl time.Duration) (location.Lease, error) {
	c.mu.Lock()
	c.at = append(c.at, c.now())
	c.mu.Unlock()
	return c.Store.ClaimNode(ctx, node, ttl)
}

// since is the times of the claims after the first n.
func (c *claimTimes) since(n int) []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.at) <= n {
		return nil
	}
	return append([]time.Time(nil), c.at[n:]...)
}
