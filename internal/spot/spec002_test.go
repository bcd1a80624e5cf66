package spot_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/checkpoint"
	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/spot"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/faulty"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

var ctx = context.Background()

// request sends a request by Spot ID and returns the handler's count.
func request(t *testing.T, e *extension.Extension, id, value string, intent ...string) (int64, error) {
	t.Helper()
	c := e.Spots().Request(id, wrapperspb.String(value)).Timeout(10 * time.Second)
	if len(intent) > 0 {
		if intent[0] == "" {
			c = c.InstanceSpot()
		} else {
			c = c.InstanceSpot(intent[0])
		}
	}
	reply, err := c.Do(ctx)
	if err != nil {
		return 0, err
	}
	return reply.(*wrapperspb.Int64Value).Value, nil
}

// writes counts the mutations a node makes through its store.
type writes struct {
	location.Store
	location.RootStore
	n atomic.Int64
}

func countWrites(s location.Store) *writes {
	return &writes{Store: s, RootStore: s.(location.RootStore)}
}

func (w *writes) CompareAndSet(ctx context.Context, k location.AuthorityKey, v location.StoreVersion, r *location.Record) (location.StoreVersion, error) {
	w.n.Add(1)
	return w.Store.CompareAndSet(ctx, k, v, r)
}

func (w *writes) Apply(ctx context.Context, ops []location.Op) ([]location.StoreVersion, error) {
	w.n.Add(1)
	return w.Store.Apply(ctx, ops)
}

func (w *writes) PutRoot(ctx context.Context, key string, data []byte) (location.RootRef, error) {
	w.n.Add(1)
	return w.RootStore.PutRoot(ctx, key, data)
}

func (w *writes) Close() error { return w.Store.Close() }

func recordCount(t *testing.T, store location.Store, kind location.Kind) int {
	t.Helper()
	page, err := store.List(ctx, kind, location.PageRequest{Size: location.MaxPageSize})
	require.NoError(t, err)
	return len(page.Items)
}

// --- Spot ID and the reserved format ---------------------------------------

// A Spot ID is one key across the whole store: the same ID cannot be a
// second Spot in another Mesh, nor an Instance Spot while it is a User Spot.
// Reference: docs/PROTOCOL.md §7.1, §12.2 item 1 (a Spot ID is one key
// across the whole store, whatever the mesh).
func TestSpotIDIsGlobalAcrossMeshes(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		a := w.start(inMesh("east"))
		w.start(inMesh("west"))
		first, err := a.Spots().GetOrCreate("hall", "room").InMesh("east").Do(ctx)
		require.NoError(t, err)
		require.Equal(t, spot.Created, first.State)
		second, err := a.Spots().GetOrCreate("hall", "room").InMesh("west").Do(ctx)
		require.NoError(t, err)
		require.Equal(t, spot.Existing, second.State, "the same ID in another Mesh is the same Spot")
		require.Equal(t, "east", second.Ref.MeshName)
		_, err = request(t, a, "hall", "x", "cart")
		require.ErrorIs(t, err, roamerr.ErrTypeMismatch, "the ID is a User Spot, not an Instance Spot")
		require.EqualValues(t, 1, w.count("room").Load())
		require.Zero(t, w.count("cart").Load())
	})
}

// A caller-given ID in the reserved Entry format is refused with
// InvalidOperation before any store write or factory run.
// Reference: PROTOCOL.md §7.1, §12.2 item 2 (refused with InvalidOperation
// before any store reservation or factory run).
func TestReservedEntryFormatIsRefusedBeforeTheStore(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		counted := countWrites(store)
		a := w.start(withStore(counted))
		before := counted.n.Load()
		reserved := "app-entry-" + uuid.NewString()
		_, err := a.Spots().GetOrCreate(reserved, "room").Do(ctx)
		require.ErrorIs(t, err, roamerr.ErrInvalidOperation)
		_, err = request(t, a, reserved, "x", "cart")
		require.ErrorIs(t, err, roamerr.ErrInvalidOperation)
		_, err = request(t, a, strings.Repeat("x", 256), "x", "cart")
		require.ErrorIs(t, err, roamerr.ErrInvalidOperation, "256 bytes")
		_, err = request(t, a, "\xff", "x", "cart")
		require.ErrorIs(t, err, roamerr.ErrInvalidOperation, "invalid UTF-8")
		require.Equal(t, before, counted.n.Load(), "no store write")
		require.Zero(t, w.count("room").Load()+w.count("cart").Load(), "no factory")
	})
}

// Create issues a lowercase canonical UUID v4, and a taken UUID ends the
// Create with AlreadyExists without a second UUID or reservation.
// Reference: PROTOCOL.md §7.2, §12.2 item 3 (Create issues a lowercase
// UUID v4 and no second one on a conflict).
func TestCreateIssuesUUIDv4AndNoSecondOnConflict(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		a := w.start()
		res, err := a.Spots().Create("room").Do(ctx)
		require.NoError(t, err)
		require.Equal(t, spot.Created, res.State)
		require.Regexp(t, regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`), res.Ref.SpotID)

		restore := spot.SetNewIDForTest(func() string { return res.Ref.SpotID })
		defer restore()
		calls := spot.NewIDCalls()
		_, err = a.Spots().Create("room").Do(ctx)
		require.ErrorIs(t, err, roamerr.ErrAlreadyExists)
		require.Equal(t, calls+1, spot.NewIDCalls(), "one UUID per Create")
		require.Equal(t, 1, recordCount(t, store, location.KindUserSpot))
		require.EqualValues(t, 1, w.count("room").Load())
	})
}

// Actors spawned on a node are members of the Entry Spot its descriptor
// published; the Entry Spot ID is taken from the descriptor, never parsed.
// Reference: PROTOCOL.md §3.4, §12.2 item 4 (Entry Spots and placement
// use the node descriptors, never a parse of the Spot ID).
func TestEntryMembershipComesFromTheDescriptor(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		a := w.start(func(c *extension.Config) { c.Node.EntryPrefix = "odd.prefix" })
		_, err := a.SpawnActor(ctx, "room", "member-1")
		require.NoError(t, err)
		v, err := store.Read(ctx, location.Key(location.KindActor, "member-1"))
		require.NoError(t, err)
		require.Equal(t, a.Node().Descriptor().GetEntrySpotId(), v.Record.GetMembership().GetSpotId())
		entry, err := store.Read(ctx, location.Key(location.KindEntry, a.Node().Descriptor().GetEntrySpotId()))
		require.NoError(t, err)
		require.Equal(t, a.NodeRid(), entry.Record.GetOwner().GetNodeRid())
	})
}

// --- Convergence of Create and GetOrCreate ----------------------------------

// Create and GetOrCreate take a stable type (and an ID), never a node:
// the framework places the Spot, and the SpotRef says where.
// Reference: PROTOCOL.md §7.2, §12.2 item 5 (Create and GetOrCreate take
// no target node or endpoint from the application).
func TestCreateNeedsNoTargetNode(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		w.startN(2)
		res, err := w.nodes[0].Spots().GetOrCreate("kitchen", "room").Do(ctx)
		require.NoError(t, err)
		require.Equal(t, spot.Created, res.State)
		rids := []string{w.nodes[0].NodeRid(), w.nodes[1].NodeRid()}
		require.Contains(t, rids, res.Ref.NodeRid)
		require.Equal(t, "default", res.Ref.MeshName)
		n, err := request(t, w.nodes[1], "kitchen", "hello")
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
	})
}

// The manager offers no Instance Spot create: Instance Spots come only from
// a first message; GetOrCreate of an existing Instance Spot's ID is a
// TypeMismatch, and the manager has no method for it.
// Reference: PROTOCOL.md §7.2, §12.2 item 6 (the manager has no Instance
// Spot create or get-or-create).
func TestManagerHasNoInstanceSpotCreate(t *testing.T) {
	mt := reflect.TypeOf(&spot.Manager{})
	for i := 0; i < mt.NumMethod(); i++ {
		name := strings.ToLower(mt.Method(i).Name)
		require.False(t, strings.Contains(name, "instance") && strings.Contains(name, "create"), mt.Method(i).Name)
	}
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		a := w.start()
		_, err := request(t, a, "basket", "x", "cart")
		require.NoError(t, err)
		_, err = a.Spots().GetOrCreate("basket", "cart").Do(ctx)
		require.ErrorIs(t, err, roamerr.ErrTypeMismatch)
	})
}

// A remote create reserves in the store, then sends UserSpotCreate with the
// reservation fence; the target reads the creation request from the
// Relocation Store (checking its hash), runs the factory and the create
// callback once, and answers one SpotReply: a redelivery of the same
// operation gets the same result, a stale fence a Stale failure.
// Reference: PROTOCOL.md §7.2, §12.2 item 8 (a remote create fixes the
// reservation and the target lifecycle in UserSpotCreate, reads the pending
// creation content from the store, and answers exactly once with
// SpotReply).
func TestRemoteCreateReadsTheRequestFromTheStore(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		a := w.start(withKinds(w.cartKind("cart"))) // a does not host rooms
		b := w.start()
		res, err := a.Spots().GetOrCreate("studio", "room").Request(wrapperspb.String("blue")).Do(ctx)
		require.NoError(t, err)
		require.Equal(t, spot.Created, res.State)
		require.Equal(t, b.NodeRid(), res.Ref.NodeRid)
		require.True(t, proto.Equal(wrapperspb.String("created:blue"), res.Reply), "the callback saw the stored request")
		require.EqualValues(t, 1, w.count("room").Load())

		rejected, err := a.Spots().GetOrCreate("attic", "room").Request(wrapperspb.String("reject")).Do(ctx)
		require.NoError(t, err)
		require.Equal(t, spot.Rejected, rejected.State)
		require.True(t, proto.Equal(wrapperspb.String("declined"), rejected.Reply))
		_, err = store.Read(ctx, location.Key(location.KindUserSpot, "attic"))
		require.ErrorIs(t, err, location.ErrNotFound, "a rejected reservation is cleaned up")
		again, err := a.Spots().GetOrCreate("attic", "room").Do(ctx)
		require.NoError(t, err)
		require.Equal(t, spot.Created, again.State, "a Rejected result is not shared with another operation")

		// A UserSpotCreate whose fence does not match the store is refused.
		cmd := &messages.UserSpotCreate{
			OperationId: uuid.NewString(), SpotId: "studio", StableType: "room",
			SourceNodeRid: a.NodeRid(), SourceNodeGeneration: a.Node().Descriptor().GetNodeGeneration(),
			DeadlineUnixNanos: time.Now().Add(5 * time.Second).UnixNano(),
			Fence: &messages.ReservationFence{StoreVersion: 1, ObjectGeneration: 1, PendingCapacityDelta: 1,
				TargetNodeRid: b.NodeRid(), TargetNodeGeneration: b.Node().Descriptor().GetNodeGeneration()},
		}
		defer a.Spots().Pending(cmd.OperationId)()
		ask := func() *messages.SpotReply {
			r, err := a.System().Root.RequestFuture(actor.NewPID(b.Node().Address(), spot.ServiceName), cmd, 5*time.Second).Result()
			require.NoError(t, err)
			return r.(*messages.SpotReply)
		}
		first := ask()
		require.Equal(t, roamerr.CodeStale, first.GetFailureCode())
		second := ask()
		require.True(t, proto.Equal(first, second), "a redelivery of the operation gets the retained result")
		require.EqualValues(t, 3, w.count("room").Load(), "no factory for a stale fence")

		// One creation holds one capacity slot: a fence reserving another
		// amount is refused.
		cmd = proto.Clone(cmd).(*messages.UserSpotCreate)
		cmd.OperationId, cmd.Fence.PendingCapacityDelta = uuid.NewString(), 0
		defer a.Spots().Pending(cmd.OperationId)()
		require.Equal(t, roamerr.CodeInvalidOperation, ask().GetFailureCode())
	})
}

// A SpotRef keeps the incarnation's generation and where it was at lookup;
// after a move the old ref still names the generation but not the owner,
// and calls by Spot ID still reach the Spot.
// Reference: PROTOCOL.md §7.1, §12.2 item 9 (a SpotRef keeps the
// generation but is not a messaging target).
func TestSpotRefIsASnapshot(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		a := w.start()
		b := w.start()
		_, err := request(t, a, "parcel", "1", "cart")
		require.NoError(t, err)
		before, owner, other := ownerOf(t, "parcel", a, b)
		_, err = owner.Relocate(ctx, extension.InstanceSpotRef("parcel"), other.NodeRid())
		require.NoError(t, err)
		after, err := a.Spots().Find(ctx, "parcel")
		require.NoError(t, err)
		require.Equal(t, before.ObjectGeneration, after.ObjectGeneration)
		require.Equal(t, other.NodeRid(), after.NodeRid)
		require.NotEqual(t, before.NodeRid, after.NodeRid)
		n, err := request(t, a, "parcel", "2")
		require.NoError(t, err)
		require.EqualValues(t, 2, n, "state moved with the Spot")
	})
}

// --- Direct call and cold activation ----------------------------------------

// A direct call names only the Spot ID; the framework resolves the owner.
// Reference: PROTOCOL.md §7.4, §12.2 item 10 (a direct call takes only a
// Spot ID, no owner route).
func TestDirectCallTakesOnlyASpotID(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		w.startN(3)
		_, err := w.nodes[0].Spots().GetOrCreate("den", "room").Do(ctx)
		require.NoError(t, err)
		for i, n := range w.nodes {
			got, err := request(t, n, "den", fmt.Sprint(i))
			require.NoError(t, err)
			require.EqualValues(t, i+1, got)
		}
		require.NoError(t, nilReply(w.nodes[2].Spots().Send("den", wrapperspb.String("one-way")).Do(ctx)))
		eventually(t, "the one-way send is handled", func() bool { return len(w.handledOf("den")) == 4 })
	})
}

func nilReply(_ proto.Message, err error) error { return err }

// A call without Instance intent to a Missing Spot ends NotFound and writes
// nothing: no creation intent, no factory.
// Reference: PROTOCOL.md §7.4, §12.2 item 11 (a message to a Missing Spot
// without Instance intent writes no creation intent).
func TestMissingWithoutInstanceIntentIsNotFound(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		counted := countWrites(store)
		a := w.start(withStore(counted))
		before := counted.n.Load()
		_, err := request(t, a, "ghost", "x")
		require.ErrorIs(t, err, roamerr.ErrNotFound)
		require.ErrorIs(t, nilReply(a.Spots().Send("ghost", wrapperspb.String("x")).Do(ctx)), roamerr.ErrNotFound)
		require.Equal(t, before, counted.n.Load())
		require.Zero(t, recordCount(t, store, location.KindInstanceSpot))
		require.Zero(t, w.count("cart").Load())
	})
}

// Instance intent cold-activates a Missing Spot with the named type, in
// the named Mesh; InMesh without Instance intent is refused.
// Reference: PROTOCOL.md §7.4, §7.5, §12.2 item 12 (Instance intent starts
// a cold activation only on a Missing Spot, with the optional mesh and
// type).
func TestInstanceIntentActivatesInTheNamedMesh(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		w.start(inMesh("east"))
		west := w.start(inMesh("west"))
		reply, err := west.Spots().Request("box", wrapperspb.String("1")).InstanceSpot("cart").InMesh("east").Do(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 1, reply.(*wrapperspb.Int64Value).Value)
		ref, err := west.Spots().Find(ctx, "box")
		require.NoError(t, err)
		require.Equal(t, "east", ref.MeshName)
		require.Equal(t, messages.SpotKind_SPOT_KIND_INSTANCE, ref.Kind)
		require.Equal(t, "cart", ref.StableType)

		_, err = west.Spots().Request("box2", wrapperspb.String("1")).InMesh("east").Do(ctx)
		require.ErrorIs(t, err, roamerr.ErrInvalidOperation, "InMesh needs Instance intent")
		_, err = west.Spots().Request("box2", wrapperspb.String("1")).InstanceSpot("cart").Do(ctx)
		require.ErrorIs(t, err, roamerr.ErrInvalidOperation, "two meshes and none named")
		_, err = west.Spots().Request("box2", wrapperspb.String("1")).InstanceSpot("cart").InMesh("north").Do(ctx)
		require.ErrorIs(t, err, roamerr.ErrNotFound, "no such mesh")
		_, err = west.Spots().Request("box2", wrapperspb.String("1")).InstanceSpot("crate").InMesh("east").Do(ctx)
		require.ErrorIs(t, err, roamerr.ErrNotFound, "no node hosts the type")
		c := west.Spots().Request("box2", wrapperspb.String("1")).Timeout(time.Second).Timeout(time.Second)
		_, err = c.Do(ctx)
		require.ErrorIs(t, err, roamerr.ErrInvalidOperation, "an option set twice")
		_, err = c.Do(ctx)
		require.ErrorIs(t, err, roamerr.ErrInvalidOperation, "submitted twice")
	})
}

// With one Instance type in the Mesh, InstanceSpot() picks it; with two,
// the type must be named.
// Reference: PROTOCOL.md §7.5 step 5, §12.2 item 13 (the mesh's only
// Instance type is chosen; with several, the type must be named).
func TestInstanceTypeIsAutoSelectedOnlyWhenUnique(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		a := w.start()
		_, err := request(t, a, "auto", "1", "")
		require.NoError(t, err)
		ref, err := a.Spots().Find(ctx, "auto")
		require.NoError(t, err)
		require.Equal(t, "cart", ref.StableType)

		w.start(withKinds(w.roomKind(), w.cartKind("cart"), w.cartKind("crate")))
		_, err = request(t, a, "auto2", "1", "")
		require.ErrorIs(t, err, roamerr.ErrInvalidOperation)
		_, err = request(t, a, "auto2", "1", "crate")
		require.NoError(t, err)
		// An existing Instance Spot is reached without naming its type.
		_, err = request(t, a, "auto", "2", "")
		require.NoError(t, err)
	})
}

// The calling node writes nothing for a cold activation: it sends the
// activation envelope, with the first message inside, to the target.
// Reference: PROTOCOL.md §7.5 step 7, §12.2 item 14 (the caller of a cold
// activation claims no owner: it sends the activation envelope, first
// message inside, to the target).
func TestColdActivationSourceWritesNothing(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		counted := countWrites(store)
		src := w.start(withStore(counted), withKinds(w.roomKind())) // hosts no Instance type
		target := w.start()
		before := counted.n.Load()
		n, err := request(t, src, "crate-1", "first", "cart")
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		require.Equal(t, before, counted.n.Load(), "the source wrote nothing")
		ref, err := src.Spots().Find(ctx, "crate-1")
		require.NoError(t, err)
		require.Equal(t, target.NodeRid(), ref.NodeRid)
		require.Equal(t, []string{"first"}, w.handledOf("crate-1"))
	})
}

// A target that holds a stale incarnation (the Spot moved away) does not
// run an activation's first message there: it reads the store and hands
// the message to the current owner, once.
// Reference: PROTOCOL.md §7.5 step 8, §12.2 item 16 (no message reaches an
// incarnation the store does not name; a node that did not win creation
// authority creates no instance of its own).
func TestActivationAtAStaleTargetReachesTheCurrentOwner(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		a := w.start()
		b := w.start(withKinds(w.roomKind(), w.cartKind("cart")))
		// Activate on a (only a is candidate while b is not asked), then
		// move to b: a keeps a following stub.
		_, err := a.Spots().Request("tin", wrapperspb.String("1")).InstanceSpot("cart").Do(ctx)
		require.NoError(t, err)
		_, owner, other := ownerOf(t, "tin", a, b)
		_, err = owner.Relocate(ctx, extension.InstanceSpotRef("tin"), other.NodeRid())
		require.NoError(t, err)
		// An activation envelope reaches the old owner.
		f := actor.NewFuture(a.System(), 5*time.Second)
		env := &actor.MessageEnvelope{Message: wrapperspb.String("2"), Sender: f.PID(),
			Header: map[string]string{relocation.HeaderOperation: uuid.NewString()}}
		first, err := relocation.ToWire("tin", env)
		require.NoError(t, err)
		// Sent as a's Spot service sends it: a node of the cluster, named.
		a.System().Root.RequestWithCustomSender(actor.NewPID(owner.Node().Address(), spot.ServiceName), &messages.SpotActivation{
			OperationId: env.Header.Get(relocation.HeaderOperation), RouteKind: 2, SpotId: "tin", StableType: "cart",
			SourceNodeRid: a.NodeRid(), SourceNodeGeneration: a.Node().Descriptor().GetNodeGeneration(),
			TargetNodeRid: owner.NodeRid(), TargetNodeGeneration: owner.Node().Descriptor().GetNodeGeneration(),
			DeadlineUnixNanos: time.Now().Add(5 * time.Second).UnixNano(), First: first,
		}, actor.NewPID(a.Node().Address(), spot.ServiceName))
		reply, err := f.Result()
		require.NoError(t, err)
		require.EqualValues(t, 2, reply.(*wrapperspb.Int64Value).Value, "handled by the moved incarnation")
		require.EqualValues(t, 2, w.count("cart").Load(), "the activation's instance and the move's restored one; no other")
		require.Equal(t, []string{"1", "2"}, w.handledOf("tin"))
	})
}

// --- Route cache and Message Follow -----------------------------------------

// Missing, Creating and store failures are never cached: a NotFound is
// followed, after another node activates the Spot, by a delivered call.
// Reference: PROTOCOL.md §7.8, §12.2 item 17 (Missing, Creating and store
// failures are never cached).
func TestMissingIsNotNegativeCached(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		a := w.start()
		b := w.start()
		_, err := request(t, a, "late", "x")
		require.ErrorIs(t, err, roamerr.ErrNotFound)
		require.Zero(t, spot.CachedRoutes(a.Spots()))
		_, err = request(t, b, "late", "1", "cart")
		require.NoError(t, err)
		n, err := request(t, a, "late", "2")
		require.NoError(t, err)
		require.EqualValues(t, 2, n)
		require.Equal(t, 1, spot.CachedRoutes(a.Spots()), "a Ready route is cached")
	})
}

// A route cached before a move still reaches the Spot through the
// committed Message Follow route, with the same operation identity; the
// hop tells the caller's node to drop its cached route. The follow queue
// has no item bound: a burst sent to the old owner during the move is
// handled whole.
// Reference: PROTOCOL.md §5.14, §12.2 item 18 (Message Follow uses only a
// committed route, has no bound of its own on items or bytes, and keeps
// the operation identity).
func TestMessageFollowKeepsOperationIdentity(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		a := w.start()
		b := w.start()
		c := w.start(withKinds(w.roomKind()))
		_, err := request(t, a, "drum", "0", "cart")
		require.NoError(t, err)
		_, err = request(t, c, "drum", "cache")
		require.NoError(t, err)
		require.Equal(t, 1, spot.CachedRoutes(c.Spots()))
		_, owner, other := ownerOf(t, "drum", a, b)
		// Sends go out during the move and after it, the later ones still on
		// c's cached route to the old owner.
		const burst, during = 3000, 1500
		done := make(chan error, 1)
		moved := make(chan struct{})
		go func() {
			for i := 0; i < burst; i++ {
				if i == during {
					<-moved
				}
				if err := nilReply(c.Spots().Send("drum", wrapperspb.String(fmt.Sprintf("b%d", i))).Do(ctx)); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
		_, err = owner.Relocate(ctx, extension.InstanceSpotRef("drum"), other.NodeRid())
		require.NoError(t, err)
		close(moved)
		require.NoError(t, <-done)
		_, err = request(t, c, "drum", "after")
		require.NoError(t, err)
		// "after" may overtake followed sends still in flight: order holds
		// per route, not across routes (PROTOCOL.md §10).
		eventually(t, "every send is handled", func() bool { return len(w.handledOf("drum")) == burst+3 })
		var sends []string
		for _, v := range w.handledOf("drum") {
			if strings.HasPrefix(v, "b") {
				sends = append(sends, v)
			}
		}
		require.Len(t, sends, burst)
		for i := 0; i < burst; i++ {
			require.Equal(t, fmt.Sprintf("b%d", i), sends[i], "in order, once")
		}
		// Followed sends arrived with the operation identity their caller
		// stamped: one distinct operation per send, hops counted.
		w.mu.Lock()
		ops, followed := map[string]bool{}, 0
		for i := 0; i < burst; i++ {
			h := w.headers[fmt.Sprintf("b%d", i)]
			require.NotEmpty(t, h[0])
			require.False(t, ops[h[0]], "operation identity reused")
			ops[h[0]] = true
			if h[1] != "" {
				followed++
			}
		}
		w.mu.Unlock()
		require.Positive(t, followed, "some sends took the Message Follow route")
		eventually(t, "the follow hint drops c's route to the old owner", func() bool {
			rid, ok := spot.CachedOwner(c.Spots(), "drum")
			return !ok || rid == other.NodeRid()
		})
	})
}

// --- Close -----------------------------------------------------------------

// Close checks the generation: the same ref closes once (true, then
// false), a ref of an older incarnation never closes the new one.
// Reference: PROTOCOL.md §7.9, §12.2 item 19 (Close checks the generation
// and never retargets a new incarnation).
func TestCloseChecksTheGeneration(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		a := w.start()
		res, err := a.Spots().GetOrCreate("porch", "room").Do(ctx)
		require.NoError(t, err)
		wrong := res.Ref
		wrong.ObjectGeneration++
		_, err = a.Spots().Close(ctx, wrong)
		require.ErrorIs(t, err, roamerr.ErrInvalidOperation)
		closed, err := a.Spots().Close(ctx, res.Ref)
		require.NoError(t, err)
		require.True(t, closed)
		closed, err = a.Spots().Close(ctx, res.Ref)
		require.NoError(t, err)
		require.False(t, closed, "that incarnation is gone")
		_, err = request(t, a, "porch", "x")
		require.ErrorIs(t, err, roamerr.ErrNotFound)
		again, err := a.Spots().GetOrCreate("porch", "room").Do(ctx)
		require.NoError(t, err)
		require.Greater(t, again.Ref.ObjectGeneration, res.Ref.ObjectGeneration)
		_, err = a.Spots().Close(ctx, res.Ref)
		require.ErrorIs(t, err, roamerr.ErrInvalidOperation, "an old ref does not close the new incarnation")
		n, err := request(t, a, "porch", "y")
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "the new incarnation serves")
	})
}

// Close of a User Spot with a member Actor answers false and keeps the
// Spot serving; nothing is moved or destroyed.
// Reference: PROTOCOL.md §7.9, §12.2 item 20 (Close never cleans up
// active memberships behind the application's back).
func TestCloseKeepsASpotWithMembers(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		a := w.start()
		res, err := a.Spots().GetOrCreate("club", "room").Do(ctx)
		require.NoError(t, err)
		_, err = a.Spots().SpawnMember(ctx, res.Ref, "room", "member-a")
		require.NoError(t, err)
		closed, err := a.Spots().Close(ctx, res.Ref)
		require.NoError(t, err)
		require.False(t, closed)
		_, err = store.Read(ctx, location.Key(location.KindActor, "member-a"))
		require.NoError(t, err, "the member stays")
		n, err := request(t, a, "club", "still here")
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
	})
}

// Closing a Spot owned by another node goes through UserSpotClose to the
// owner, which reads the store itself; the answer is SpotReply's closed
// flag, and later calls find no Spot.
// Reference: PROTOCOL.md §7.9, §12.2 item 21 (a remote close fixes the
// SpotRef, owner generation, StoreVersion and target lifecycle in
// UserSpotClose, and completes only by its answer, never by a store read).
func TestRemoteCloseGoesToTheOwner(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		a := w.start(withKinds(w.cartKind("cart")))
		b := w.start()
		res, err := a.Spots().GetOrCreate("loft", "room").Do(ctx)
		require.NoError(t, err)
		require.Equal(t, b.NodeRid(), res.Ref.NodeRid)
		_, err = request(t, a, "loft", "before")
		require.NoError(t, err)
		closed, err := a.Spots().Close(ctx, res.Ref)
		require.NoError(t, err)
		require.True(t, closed)
		_, err = store.Read(ctx, location.Key(location.KindUserSpot, "loft"))
		require.ErrorIs(t, err, location.ErrNotFound)
		_, err = request(t, a, "loft", "after")
		require.ErrorIs(t, err, roamerr.ErrNotFound)

		// A UserSpotClose with a stale StoreVersion is a typed failure.
		res, err = a.Spots().GetOrCreate("loft", "room").Do(ctx)
		require.NoError(t, err)
		v, err := store.Read(ctx, location.Key(location.KindUserSpot, "loft"))
		require.NoError(t, err)
		cmd := &messages.UserSpotClose{OperationId: uuid.NewString(), Ref: &messages.SpotRef{SpotId: "loft", ObjectGeneration: res.Ref.ObjectGeneration},
			SourceNodeRid: a.NodeRid(), SourceNodeGeneration: a.Node().Descriptor().GetNodeGeneration(),
			TargetNodeRid: b.NodeRid(), TargetNodeGeneration: b.Node().Descriptor().GetNodeGeneration(),
			ExpectedOwnerGeneration: v.Record.GetAuthorityOwnerGeneration(), ExpectedStoreVersion: uint64(v.Version) + 1,
			DeadlineUnixNanos: time.Now().Add(5 * time.Second).UnixNano()}
		defer a.Spots().Pending(cmd.OperationId)()
		r, err := a.System().Root.RequestFuture(actor.NewPID(b.Node().Address(), spot.ServiceName), cmd, 5*time.Second).Result()
		require.NoError(t, err)
		require.Equal(t, roamerr.CodeStale, r.(*messages.SpotReply).GetFailureCode())
	})
}

// --- Reactivation (PROTOCOL.md §7.10) and recovery (PROTOCOL.md §7.7) --------

// An Instance Spot of a PreserveStateWith kind whose owner ended is not
// reactivated empty on its own: calls answer Unavailable naming the cause
// until an operator accepts the loss with ReleaseEnded; then the next call
// activates it empty. ReleaseEnded refuses a live owner.
// Reference: PROTOCOL.md §7.10 (automatic release only where no state is lost).
func TestStatefulSpotOfAnEndedOwnerWaitsForTheOperator(t *testing.T) {
	onBothStoresInLogicalTime(t, func(t *testing.T, w *world) {
		store := w.store
		vault := w.cartKind("vault")
		vault.ReactivateEmpty, vault.RecoverByOperator = false, true
		caller := w.start(withKinds(w.roomKind()))
		doomed := w.start(withKinds(vault))
		n, err := request(t, caller, "strongbox", "1", "vault")
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		_, err = caller.Spots().ReleaseEnded(ctx, "strongbox")
		require.ErrorIs(t, err, roamerr.ErrInvalidOperation, "the owner is alive")
		w.eventually(t, "the activation's recovery pointer removed", func() bool {
			v, err := store.Read(ctx, location.Key(location.KindInstanceSpot, "strongbox"))
			require.NoError(t, err)
			return v.Record.GetActivationRecovery() == nil
		})
		require.NoError(t, w.stop(t, doomed))
		w.start(withKinds(vault))

		_, err = past(t, w, roamerr.ErrOwnerEnding, func() (int64, error) { return w.request(t, caller, "strongbox", "2", "vault") })
		require.ErrorIs(t, err, roamerr.ErrUnavailable)
		require.Contains(t, err.Error(), "ReleaseEnded")

		released, err := caller.Spots().ReleaseEnded(ctx, "strongbox")
		require.NoError(t, err)
		require.True(t, released)
		released, err = caller.Spots().ReleaseEnded(ctx, "strongbox")
		require.NoError(t, err)
		require.False(t, released, "nothing left to release")
		n, err = request(t, caller, "strongbox", "3", "vault")
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "a new, empty incarnation")
		require.Equal(t, []string{"1", "3"}, w.handledOf("strongbox"))
	})
}

// storedCount is the count the last checkpoint of an Instance Spot holds
// (-1: none, or a closed Spot's tombstone).
func storedCount(t *testing.T, store location.Store, id string) int64 {
	t.Helper()
	return storedCountOf(t, store, location.Key(location.KindInstanceSpot, id))
}

// storedCountOf is storedCount of any object's key.
func storedCountOf(t *testing.T, store location.Store, key location.AuthorityKey) int64 {
	t.Helper()
	data, _, err := store.(location.CheckpointStore).GetCheckpoint(ctx, key)
	if errors.Is(err, location.ErrNotFound) {
		return -1
	}
	require.NoError(t, err)
	c, err := checkpoint.Decode(data)
	require.NoError(t, err)
	if c.NoState {
		return -1
	}
	var n int64
	_, err = fmt.Sscan(string(c.State), &n)
	require.NoError(t, err)
	return n
}

// A stateful Instance Spot whose owner ended comes back by itself from its
// last checkpoint (its default recovery): the next call finds it on a live
// node with a new generation and the state the checkpoint held, and the
// recovery claims the checkpoint first, so nothing of the ended
// incarnation can replace it later.
// Reference: docs/FAULTS.md, "Checkpoints and recovery".
func TestStatefulSpotOfAnEndedOwnerComesBackFromItsCheckpoint(t *testing.T) {
	onBothStoresInLogicalTime(t, func(t *testing.T, w *world) {
		store := w.store
		vault := w.cartKind("vault")
		vault.ReactivateEmpty = false
		vault.CheckpointIdle = 20 * time.Millisecond
		caller := w.start(withKinds(w.roomKind()))
		doomed := w.start(withKinds(vault))
		for i, v := range []string{"1", "2", "3"} {
			n, err := request(t, caller, "safe", v, "vault")
			require.NoError(t, err)
			require.EqualValues(t, i+1, n)
		}
		before, err := caller.Spots().Find(ctx, "safe")
		require.NoError(t, err)
		w.eventually(t, "the checkpoint of the third message", func() bool { return storedCount(t, store, "safe") == 3 })
		require.NoError(t, w.stop(t, doomed))
		w.start(withKinds(vault))

		// The caller may still hold its route to the stopped node (a lost
		// connection: the call did not run there), and the ended owner is
		// taken over a lease TTL after it is first seen gone.
		var n int64
		w.eventually(t, "the Spot recovered", func() bool {
			n, err = w.request(t, caller, "safe", "4", "vault")
			if errors.Is(err, roamerr.ErrOwnerEnding) || (err != nil && strings.Contains(err.Error(), "was lost")) {
				return false
			}
			require.NoError(t, err)
			return true
		})
		require.EqualValues(t, 4, n, "the state came back from the checkpoint")
		after, err := caller.Spots().Find(ctx, "safe")
		require.NoError(t, err)
		require.NotEqual(t, doomed.NodeRid(), after.NodeRid)
		// Recovered by the call (a new generation) or, first, by the live
		// node's pass (the same generation, the next owner generation).
		rec, err := store.Read(ctx, location.Key(location.KindInstanceSpot, "safe"))
		require.NoError(t, err)
		require.True(t, after.ObjectGeneration > before.ObjectGeneration || rec.Record.GetAuthorityOwnerGeneration() > 1,
			"a new incarnation: generation %d (was %d), owner generation %d", after.ObjectGeneration, before.ObjectGeneration, rec.Record.GetAuthorityOwnerGeneration())
		require.Equal(t, []string{"1", "2", "3", "4"}, w.handledOf("safe"), "nothing handled twice")
	})
}

// A stateful Instance Spot whose owner ended comes back without waiting
// for a call: a live node that hosts its kind (the first of its
// candidates) recovers it from its last checkpoint, and the next call finds
// it serving there with its state.
// Reference: docs/FAULTS.md, "Checkpoints and recovery".
func TestStatefulSpotOfAnEndedOwnerComesBackWithoutACall(t *testing.T) {
	onBothStoresInLogicalTime(t, func(t *testing.T, w *world) {
		store := w.store
		vault := w.cartKind("vault")
		vault.ReactivateEmpty = false
		vault.CheckpointIdle = 20 * time.Millisecond
		caller := w.start(withKinds(w.roomKind()))
		doomed := w.start(withKinds(vault))
		for _, v := range []string{"1", "2"} {
			_, err := request(t, caller, "locker", v, "vault")
			require.NoError(t, err)
		}
		w.eventually(t, "the checkpoint of the second message", func() bool { return storedCount(t, store, "locker") == 2 })
		require.NoError(t, w.stop(t, doomed))
		rescuer := w.start(withKinds(vault))

		key := location.Key(location.KindInstanceSpot, "locker")
		w.eventually(t, "the Spot recovered on the live node without a call", func() bool {
			v, err := store.Read(ctx, key)
			require.NoError(t, err)
			return v.Record.GetOwner().GetNodeRid() == rescuer.NodeRid() &&
				v.Record.GetState() == messages.LifecycleState_LIFECYCLE_STATE_READY
		})
		require.Equal(t, []string{"1", "2"}, w.handledOf("locker"), "no call ran meanwhile")
		n, err := request(t, caller, "locker", "3", "vault")
		require.NoError(t, err)
		require.EqualValues(t, 3, n, "with the checkpoint's state")
		require.Equal(t, []string{"1", "2", "3"}, w.handledOf("locker"))
	})
}

// A node that stops without moving its objects away checkpoints what
// they handled since their last capture first: their recovery elsewhere
// loses nothing (here the policy alone would not have captured for an
// hour).
// Reference: docs/FAULTS.md, "Checkpoints and recovery".
func TestStoppingNodeCheckpointsItsObjectsFirst(t *testing.T) {
	onBothStoresInLogicalTime(t, func(t *testing.T, w *world) {
		store := w.store
		vault := w.cartKind("vault")
		vault.ReactivateEmpty = false
		vault.CheckpointInterval = time.Hour
		caller := w.start(withKinds(w.roomKind()))
		doomed := w.start(withKinds(vault))
		for _, v := range []string{"1", "2", "3"} {
			_, err := request(t, caller, "till", v, "vault")
			require.NoError(t, err)
		}
		require.Equal(t, int64(-1), storedCount(t, store, "till"), "nothing captured yet")
		require.NoError(t, w.stop(t, doomed))
		require.Equal(t, int64(3), storedCount(t, store, "till"), "captured at the stop")
		w.start(withKinds(vault))
		var n int64
		var err error
		w.eventually(t, "the Spot recovered", func() bool {
			n, err = w.request(t, caller, "till", "4", "vault")
			if errors.Is(err, roamerr.ErrOwnerEnding) || (err != nil && strings.Contains(err.Error(), "was lost")) {
				return false
			}
			require.NoError(t, err)
			return true
		})
		require.EqualValues(t, 4, n)
	})
}

// everyTurnVault is a stateful Instance Spot kind checkpointed after every
// message, recovered from its checkpoints (not ReactivateEmpty).
func (w *world) everyTurnVault() extension.Kind {
	vault := w.cartKind("vault")
	vault.ReactivateEmpty = false
	vault.CheckpointEvery = 1
	return vault
}

// A per-turn checkpoint policy holds the first message's state too: its
// capture, held back while the cold activation's recovery pointer is in
// the store, is taken once the pointer is gone, without a second message.
// Reference: docs/FAULTS.md, "Checkpoints and recovery".
func TestEveryTurnCheckpointHoldsTheFirstMessage(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		caller := w.start(withKinds(w.everyTurnVault()))
		_, err := request(t, caller, "coin", "1", "vault")
		require.NoError(t, err)
		eventually(t, "the first message's checkpoint", func() bool { return storedCount(t, store, "coin") == 1 })
	})
}

// A first message to a new ID of a kind that checkpoints reads no
// checkpoint and claims none: its reservation checks, in its own
// transaction, that none is stored (location.OpCheckNoCheckpoint), and the
// first capture creates the checkpoint without a read. Before, the claim's
// read and write stood between the reservation and the first message.
// Reference: docs/FAULTS.md, "Checkpoints and recovery"; docs/PROTOCOL.md
// §7.5.
func TestAColdActivationOfANewIDReadsNoCheckpoint(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		counted, err := faulty.New(store, faulty.Config{})
		require.NoError(t, err)
		w := newWorld(t, counted)
		caller := w.start(withKinds(w.everyTurnVault()))
		before := counted.Stats().ByOp
		n, err := request(t, caller, "coin", "1", "vault")
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		eventually(t, "the first message's checkpoint", func() bool { return storedCount(t, store, "coin") == 1 })
		eventually(t, "the recovery pointer's removal", func() bool {
			v, err := store.Read(ctx, location.Key(location.KindInstanceSpot, "coin"))
			return err == nil && v.Record.GetActivationRecovery() == nil
		})
		after := counted.Stats().ByOp
		require.Equal(t, before["get checkpoint"], after["get checkpoint"], "no checkpoint read, by a claim or before the first write")
		require.Equal(t, before["put checkpoint"]+1, after["put checkpoint"], "one write: the first capture's")
		// The recovery root goes in the pointer removal's transaction
		// (location.OpDeleteRoot), not in a call of its own.
		require.Equal(t, before["delete root"], after["delete root"], "no root delete of its own")
	})
}

// A first message to a Missing ID whose checkpoint is stored (left by a
// recovery that failed half-way, which released the record) starts from
// that checkpoint: the reservation's check fails, the reservation is made
// again without it, and the incarnation claims the checkpoint.
// Reference: docs/FAULTS.md, "Checkpoints and recovery".
func TestAColdActivationOverAStoredCheckpointStartsFromIt(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		caller := w.start(withKinds(w.everyTurnVault()))
		key := location.Key(location.KindInstanceSpot, "jar")
		data, err := checkpoint.Encode(checkpoint.Checkpoint{Fence: checkpoint.Fence{ObjectGeneration: 1, OwnerGeneration: 2},
			StableType: "vault", State: []byte("5")})
		require.NoError(t, err)
		_, err = store.(location.CheckpointStore).PutCheckpoint(ctx, key, 0, data)
		require.NoError(t, err)
		n, err := request(t, caller, "jar", "6", "vault")
		require.NoError(t, err)
		require.EqualValues(t, 6, n, "the stored state, and the first message")
		eventually(t, "the checkpoint of the first message", func() bool { return storedCount(t, store, "jar") == 6 })
	})
}

// A closed Spot's checkpoint goes with it (a tombstone, so no late
// capture brings it back): the same ID activated again starts empty.
// Reference: docs/FAULTS.md, "Checkpoints and recovery" (a Close removes
// the checkpoint).
func TestClosedSpotLeavesNoCheckpoint(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		caller := w.start(withKinds(w.everyTurnVault()))
		for _, v := range []string{"1", "2"} {
			_, err := request(t, caller, "drawer", v, "vault")
			require.NoError(t, err)
		}
		eventually(t, "a checkpoint", func() bool { return storedCount(t, store, "drawer") == 2 })
		_, err := request(t, caller, "drawer", "close", "vault")
		require.NoError(t, err)
		eventually(t, "the Spot and its checkpoint gone", func() bool {
			_, err := caller.Spots().Find(ctx, "drawer")
			return errors.Is(err, roamerr.ErrNotFound) && storedCount(t, store, "drawer") == -1
		})
		n, err := request(t, caller, "drawer", "again", "vault")
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "a new Spot of the same ID starts empty")
	})
}

// An Instance Spot whose owner's lifecycle ended is reactivated by a call
// with Instance intent on a live node, with its stored Mesh and type and a
// new generation; a call without intent is Unavailable.
// Reference: PROTOCOL.md §3.4 (ended owners), §12.2 item 22, §7.10 (an
// Instance Spot of an ended owner is reactivated on a live node).
func TestInstanceSpotIsReactivatedAfterItsOwnerEnded(t *testing.T) {
	onBothStoresInLogicalTime(t, func(t *testing.T, w *world) {
		store := w.store
		caller := w.start(withKinds(w.roomKind()))
		doomed := w.start()
		_, err := request(t, caller, "phoenix", "1", "cart")
		require.NoError(t, err)
		before, err := caller.Spots().Find(ctx, "phoenix")
		require.NoError(t, err)
		require.Equal(t, doomed.NodeRid(), before.NodeRid)
		// The owner ends after its activation completed: the recovery
		// pointer is gone once the first handler returned (an owner that
		// ends before that is resumed from the root instead; the stored
		// first message then runs again, see docs/FAULTS.md).
		w.eventually(t, "the activation's recovery pointer removed", func() bool {
			v, err := store.Read(ctx, location.Key(location.KindInstanceSpot, "phoenix"))
			require.NoError(t, err)
			return v.Record.GetActivationRecovery() == nil
		})
		require.NoError(t, w.stop(t, doomed))
		_, err = w.request(t, caller, "phoenix", "2")
		require.True(t, errors.Is(err, roamerr.ErrUnavailable) || errors.Is(err, roamerr.ErrStale), "%v", err)
		_, err = past(t, w, roamerr.ErrOwnerEnding, func() (int64, error) { return w.request(t, caller, "phoenix", "3", "cart") })
		require.ErrorIs(t, err, roamerr.ErrUnavailable, "no live node hosts the type")
		require.NotErrorIs(t, err, roamerr.ErrOwnerEnding)
		heir := w.start() // a node that has not seen the owner gone yet
		n, err := past(t, w, roamerr.ErrOwnerEnding, func() (int64, error) { return w.request(t, caller, "phoenix", "4", "") })
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "a new incarnation")
		after, err := caller.Spots().Find(ctx, "phoenix")
		require.NoError(t, err)
		require.Equal(t, heir.NodeRid(), after.NodeRid)
		require.Equal(t, before.MeshName, after.MeshName)
		require.Equal(t, "cart", after.StableType)
		require.Greater(t, after.ObjectGeneration, before.ObjectGeneration)
	})
}

// Moving a User Spot's member Actor keeps its membership; only an Entry
// Spot Actor joins the target node's Entry Spot. So the User Spot's Close
// still sees the member after the move.
// Reference: PROTOCOL.md §7.9, §5.11 (only an Entry Spot Actor's
// membership changes with a move).
func TestMovingAMemberKeepsItsMembership(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		a, b := w.start(), w.start()
		res, err := a.Spots().GetOrCreate("band", "room").Do(ctx)
		require.NoError(t, err)
		owner := a
		if res.Ref.NodeRid == b.NodeRid() {
			owner = b
		}
		other := a
		if owner == a {
			other = b
		}
		_, err = owner.Spots().SpawnMember(ctx, res.Ref, "room", "drummer")
		require.NoError(t, err)
		_, err = owner.SpawnActor(ctx, "room", "loner")
		require.NoError(t, err)
		for _, id := range []string{"drummer", "loner"} {
			_, err = owner.Relocate(ctx, extension.ActorRef(id), other.NodeRid())
			require.NoError(t, err)
		}
		v, err := store.Read(ctx, location.Key(location.KindActor, "drummer"))
		require.NoError(t, err)
		require.Equal(t, other.NodeRid(), v.Record.GetOwner().GetNodeRid())
		require.Equal(t, "band", v.Record.GetMembership().GetSpotId(), "a member stays a member of its User Spot")
		require.Equal(t, res.Ref.ObjectGeneration, v.Record.GetMembership().GetSpotGeneration())
		v, err = store.Read(ctx, location.Key(location.KindActor, "loner"))
		require.NoError(t, err)
		require.Equal(t, other.Node().EntrySpotID(), v.Record.GetMembership().GetSpotId(), "an Entry Spot Actor joins the target's Entry Spot")
		closed, err := owner.Spots().Close(ctx, res.Ref)
		require.NoError(t, err)
		require.False(t, closed, "the User Spot still has its member")
	})
}

// A membership write is accepted only while the User Spot is Ready with
// the generation the member names.
// Reference: PROTOCOL.md §7.10 (memberships are validated).
func TestMembershipNeedsTheActiveGeneration(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		a := w.start()
		res, err := a.Spots().GetOrCreate("guild", "room").Do(ctx)
		require.NoError(t, err)
		stale := res.Ref
		stale.ObjectGeneration--
		_, err = a.Spots().SpawnMember(ctx, stale, "room", "m1")
		require.ErrorIs(t, err, roamerr.ErrStale)
		closed, err := a.Spots().Close(ctx, res.Ref)
		require.NoError(t, err)
		require.True(t, closed)
		_, err = a.Spots().SpawnMember(ctx, res.Ref, "room", "m2")
		require.ErrorIs(t, err, roamerr.ErrStale)
		require.Zero(t, recordCount(t, store, location.KindActor))
	})
}

// An activation whose owner ended after its reservation, or after Ready
// but before its first handler completed, is resumed by a live node's
// start-up scan with the same generation: the first message from the
// recovery root is handled first, then the pointer and the root go.
// Reference: PROTOCOL.md §7.7.
func TestStartUpScanResumesAnInterruptedActivation(t *testing.T) {
	for _, state := range []messages.LifecycleState{messages.LifecycleState_LIFECYCLE_STATE_CREATING, messages.LifecycleState_LIFECYCLE_STATE_READY} {
		t.Run(state.String(), func(t *testing.T) {
			onBothStoresInLogicalTime(t, func(t *testing.T, w *world) {
				store := w.store
				key := location.Key(location.KindInstanceSpot, "lazarus")
				op := uuid.NewString()
				first, err := relocation.ToWire("lazarus", &actor.MessageEnvelope{Message: wrapperspb.String("first"),
					Header: map[string]string{relocation.HeaderOperation: op}})
				require.NoError(t, err)
				envelope, err := proto.Marshal(&messages.SpotActivation{OperationId: op, RouteKind: 2, SpotId: "lazarus", StableType: "cart", First: first})
				require.NoError(t, err)
				roots := store.(location.RootStore)
				ref, err := roots.PutRoot(ctx, "activation-"+op, envelope)
				require.NoError(t, err)
				// The owner is a lifecycle with no descriptor: it ended.
				_, err = store.CompareAndSet(ctx, key, 0, &location.Record{
					ObjectGeneration: 77, AuthorityOwnerGeneration: 1, State: state, StableType: "cart",
					SpotKind: messages.SpotKind_SPOT_KIND_INSTANCE,
					Owner:    &messages.Owner{Mesh: "default", NodeRid: "gone", NodeGeneration: 1, LeaseId: "gone"},
					ActivationRecovery: &messages.ActivationRecovery{RecoveryKey: ref.Key, RootSha256: ref.SHA256[:],
						RootSize: ref.Size, OperationId: op, ReservationFence: 77},
				})
				require.NoError(t, err)
				a := w.start()
				_, err = past(t, w, roamerr.ErrOwnerEnding, func() (struct{}, error) { return struct{}{}, a.Spots().Recover(ctx) })
				require.NoError(t, err)
				w.eventually(t, "the first message is handled", func() bool { return len(w.handledOf("lazarus")) == 1 })
				n, err := request(t, a, "lazarus", "second")
				require.NoError(t, err)
				require.EqualValues(t, 2, n)
				require.Equal(t, []string{"first", "second"}, w.handledOf("lazarus"))
				v, err := store.Read(ctx, key)
				require.NoError(t, err)
				require.EqualValues(t, 77, v.Record.GetObjectGeneration(), "the same generation")
				require.Equal(t, a.NodeRid(), v.Record.GetOwner().GetNodeRid())
				w.eventually(t, "pointer and root are gone", func() bool {
					v, err := store.Read(ctx, key)
					_, _, rerr := roots.GetRoot(ctx, ref.Key)
					return err == nil && v.Record.GetActivationRecovery() == nil && errors.Is(rerr, location.ErrNotFound)
				})
				w.mu.Lock()
				require.Empty(t, w.firstBad)
				w.mu.Unlock()
			})
		})
	}
}

// An Instance Spot closes itself from its handler: messages it had
// accepted are still handled, then the authority is released; a call
// without intent finds nothing, one with Instance intent activates a new
// incarnation.
// Reference: PROTOCOL.md §7.9 (an Instance Spot closes itself from its own
// handler or timer: CloseSelf).
func TestInstanceSpotClosesItself(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		a := w.start()
		_, err := request(t, a, "mayfly", "1", "cart")
		require.NoError(t, err)
		before, err := a.Spots().Find(ctx, "mayfly")
		require.NoError(t, err)
		_, err = request(t, a, "mayfly", "close")
		require.NoError(t, err)
		eventually(t, "the authority is released", func() bool {
			_, err := store.Read(ctx, location.Key(location.KindInstanceSpot, "mayfly"))
			return errors.Is(err, location.ErrNotFound)
		})
		_, err = request(t, a, "mayfly", "2")
		require.ErrorIs(t, err, roamerr.ErrNotFound)
		n, err := request(t, a, "mayfly", "3", "cart")
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "a new incarnation")
		after, err := a.Spots().Find(ctx, "mayfly")
		require.NoError(t, err)
		require.Greater(t, after.ObjectGeneration, before.ObjectGeneration)
	})
}

// A reservation that outlived its activation's deadline under a live
// owner (its answer from the store was lost) does not block the Spot: the
// next activation resumes it from its recovery root, the stored first
// message first. A record of this node's own with no incarnation behind
// it is taken over the same way.
// Reference: PROTOCOL.md §7.7, §7.2 (no authority stays Creating forever).
func TestAbandonedActivationIsResumed(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		a := w.start()
		b := w.start(withKinds(w.roomKind())) // alive, hosts no cart: never the target
		owner := func(e *extension.Extension) *messages.Owner {
			d := e.Node().Descriptor()
			return &messages.Owner{Mesh: d.GetMesh(), NodeRid: d.GetNodeRid(), NodeGeneration: d.GetNodeGeneration(), LeaseId: d.GetLeaseId()}
		}
		for _, c := range []struct {
			id       string
			owner    *messages.Owner
			deadline time.Time
		}{
			{"stuck-past-deadline", owner(b), time.Now().Add(-time.Minute)}, // b is alive but gave up
			{"stuck-own", owner(a), time.Now().Add(time.Minute)},            // not late: stranded on a itself
		} {
			op := uuid.NewString()
			first, err := relocation.ToWire(c.id, &actor.MessageEnvelope{Message: wrapperspb.String("stored-first"),
				Header: map[string]string{relocation.HeaderOperation: op}})
			require.NoError(t, err)
			env, err := proto.Marshal(&messages.SpotActivation{OperationId: op, RouteKind: 2, SpotId: c.id, StableType: "cart", First: first})
			require.NoError(t, err)
			ref, err := store.(location.RootStore).PutRoot(ctx, "activation-"+op, env)
			require.NoError(t, err)
			_, err = store.CompareAndSet(ctx, location.Key(location.KindInstanceSpot, c.id), 0, &location.Record{
				ObjectGeneration: 9, AuthorityOwnerGeneration: 1, State: messages.LifecycleState_LIFECYCLE_STATE_CREATING,
				StableType: "cart", SpotKind: messages.SpotKind_SPOT_KIND_INSTANCE, Owner: c.owner,
				ActivationRecovery: &messages.ActivationRecovery{RecoveryKey: ref.Key, RootSha256: ref.SHA256[:], RootSize: ref.Size,
					OperationId: op, DeadlineUnixNanos: c.deadline.UnixNano()},
			})
			require.NoError(t, err)
			n, err := request(t, a, c.id, "mine", "cart")
			require.NoError(t, err)
			require.EqualValues(t, 2, n)
			require.Equal(t, []string{"stored-first", "mine"}, w.handledOf(c.id))
		}
	})
}

// One caller's two calls to a Missing Instance Spot — a send, then a
// request — are handled in the caller's order: both cold activations go to
// the same target (placement is a function of the Spot ID), whose per-ID
// queue runs them in arrival order on the caller's one connection.
// Reference: PROTOCOL.md §7.5 (cold activation), §7.8 (a caller's order).
func TestOneCallersColdActivationsKeepTheirOrder(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		w.startN(3)
		caller := w.nodes[0]
		for i := 0; i < 30; i++ {
			id := fmt.Sprintf("ordered-%d", i)
			_, err := caller.Spots().Send(id, wrapperspb.String(id+"-first")).InstanceSpot("cart").Do(ctx)
			require.NoError(t, err)
			_, err = request(t, caller, id, id+"-second", "cart")
			require.NoError(t, err)
			require.Equal(t, []string{id + "-first", id + "-second"}, w.handledOf(id), "handled in the caller's order")
		}
	})
}

// holdStore is a Location Store whose first write that match selects
// waits until release is closed (a store far away, a retried write);
// held is closed when it starts waiting.
type holdStore struct {
	*memstore.Store
	match    func(ctx context.Context, s *memstore.Store, op location.Op) bool
	held     chan struct{}
	heldOnce atomic.Bool
	release  chan struct{}
}

func newHoldStore(match func(ctx context.Context, s *memstore.Store, op location.Op) bool) *holdStore {
	return &holdStore{Store: memstore.New(), match: match, held: make(chan struct{}), release: make(chan struct{})}
}

func (s *holdStore) Apply(ctx context.Context, ops []location.Op) ([]location.StoreVersion, error) {
	for _, op := range ops {
		if s.match(ctx, s.Store, op) && s.heldOnce.CompareAndSwap(false, true) {
			close(s.held)
			select {
			case <-s.release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	return s.Store.Apply(ctx, ops)
}

// removesPointer: the compare-and-set that removes a cold activation's
// recovery pointer.
func removesPointer(ctx context.Context, s *memstore.Store, op location.Op) bool {
	if op.Kind != location.OpUpdate || op.Key.Kind != location.KindInstanceSpot || op.Record.GetActivationRecovery() != nil ||
		op.Record.GetState() != messages.LifecycleState_LIFECYCLE_STATE_READY {
		return false
	}
	cur, err := s.Read(ctx, op.Key)
	return err == nil && cur.Record.GetActivationRecovery() != nil
}

// reserves: a cold activation's reservation.
func reserves(_ context.Context, _ *memstore.Store, op location.Op) bool {
	return op.Kind == location.OpCreate && op.Key.Kind == location.KindInstanceSpot
}

// pointerProbe records, for every message it handles, whether the store
// still named its activation's recovery pointer at that moment. Its first
// handler returns only once proceed is closed.
type pointerProbe struct {
	store     location.Store
	seen      chan<- string
	proceed   <-chan struct{}
	ran       bool
	panicOnce *atomic.Bool // if set, the first handler of all the incarnations panics after reporting
}

// Its state is nothing: it only reports.
type probeState struct{}

func (probeState) Capture(actor.Actor) ([]byte, error) { return []byte{}, nil }
func (probeState) Restore(actor.Actor, []byte) error   { return nil }

func (p *pointerProbe) Receive(c actor.Context) {
	s, ok := c.Message().(*wrapperspb.StringValue)
	if !ok {
		return
	}
	v, err := p.store.Read(context.Background(), location.Key(location.KindInstanceSpot, spotIDOf(c.Self())))
	pointer := err != nil || v.Record.GetActivationRecovery() != nil
	p.seen <- fmt.Sprintf("%s pointer=%t", s.Value, pointer)
	if !p.ran {
		p.ran = true
		<-p.proceed
		if p.panicOnce != nil && p.panicOnce.CompareAndSwap(false, true) {
			panic("the first handler fails")
		}
	}
	c.Respond(wrapperspb.Int64(1))
}

// After a cold activation's first message, the incarnation runs nothing
// else until the recovery pointer's removal has landed, and a move waits
// until then: an owner that ends in between is resumed from the
// first message alone (PROTOCOL.md §7.7), which must then be all it did —
// otherwise a resumed PreserveStateWith Spot would start without what the
// later messages did.
// Reference: PROTOCOL.md §7.5 step 12, §7.7, §7.10.
func TestNothingRunsAfterTheFirstMessageUntilTheRecoveryPointerIsGone(t *testing.T) {
	held := newHoldStore(removesPointer)
	inner := held.Store
	w := newWorld(t, inner)
	seen := make(chan string, 4)
	proceed := make(chan struct{})
	probe := extension.Kind{StableType: "probe", Instance: true, Policy: extension.PreserveStateWith(probeState{}),
		Producer: func() actor.Actor { return &pointerProbe{store: inner, seen: seen, proceed: proceed} }}
	node := w.start(withKinds(probe), withStore(held))
	// The node calls its own Spot (the only node yet, so it is activated
	// there): a local send is in the incarnation's queue when Do returns.
	_, err := node.Spots().Send("ledger", wrapperspb.String("1")).InstanceSpot("probe").Do(ctx)
	require.NoError(t, err)
	require.Equal(t, "1 pointer=true", <-seen, "the first message runs with the pointer set")
	// The second message waits in the queue behind the running first one.
	_, err = node.Spots().Send("ledger", wrapperspb.String("2")).Do(ctx)
	require.NoError(t, err)
	close(proceed)
	<-held.held // the first handler returned; the pointer's removal is held
	other := w.start(withKinds(probe))
	moved := make(chan error, 1)
	go func() {
		_, err := node.Relocate(ctx, extension.InstanceSpotRef("ledger"), other.NodeRid())
		moved <- err
	}()
	close(held.release)
	require.Equal(t, "2 pointer=false", <-seen, "the second message ran only once the pointer was gone")
	require.NoError(t, <-moved, "the move waited for the pointer's removal")
	ref, err := node.Spots().Find(ctx, "ledger")
	require.NoError(t, err)
	require.Equal(t, other.NodeRid(), ref.NodeRid)
	// The move carried no pointer, and the second message was handled
	// before it: the source handled both, the target none.
	v, err := inner.Read(ctx, location.Key(location.KindInstanceSpot, "ledger"))
	require.NoError(t, err)
	require.Nil(t, v.Record.GetActivationRecovery())
	// Asked again, from the old owner: it is there already.
	out, err := node.Relocate(ctx, extension.InstanceSpotRef("ledger"), other.NodeRid())
	require.NoError(t, err)
	require.Zero(t, out.Pause, "a move to where it is returns at once")
}

// A one-way send that goes with a cold activation returns once the new
// incarnation dispatches it, not when it is handed to the transport: the
// caller's next call, which may go straight to the now Ready incarnation,
// cannot overtake it.
// Reference: PROTOCOL.md §7.5 step 11 (no later message overtakes the
// first).
func TestASendWithAColdActivationReturnsOnceDispatched(t *testing.T) {
	held := newHoldStore(reserves)
	w := newWorld(t, held.Store)
	seen := make(chan string, 4)
	probe := extension.Kind{StableType: "probe", Instance: true, Policy: extension.PreserveStateWith(probeState{}),
		Producer: func() actor.Actor { return &pointerProbe{store: held.Store, seen: seen, proceed: closedChan()} }}
	node := w.start(withKinds(probe), withStore(held))
	sent := make(chan error, 1)
	go func() {
		_, err := node.Spots().Send("parcel", wrapperspb.String("1")).InstanceSpot("probe").Do(ctx)
		sent <- err
	}()
	<-held.held // the activation's reservation waits: nothing can be dispatched yet
	select {
	case err := <-sent:
		t.Fatalf("the send returned (%v) before its activation reserved the Spot", err)
	default:
	}
	close(held.release)
	require.NoError(t, <-sent)
	n, err := request(t, node, "parcel", "2")
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Equal(t, "1 pointer=true", <-seen)
	require.Equal(t, "2 pointer=false", <-seen)
}

func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// A first handler that panics ends the first message's turn all the same:
// the recovery pointer goes, the incarnation (restarted by its supervisor)
// serves the next message, and it can move.
// Reference: PROTOCOL.md §7.5 step 12.
func TestAFirstHandlerThatPanicsStillEndsTheActivation(t *testing.T) {
	store := memstore.New()
	w := newWorld(t, store)
	seen := make(chan string, 4)
	var panicked atomic.Bool
	probe := extension.Kind{StableType: "probe", Instance: true, Policy: extension.PreserveStateWith(probeState{}),
		Producer: func() actor.Actor {
			return &pointerProbe{store: store, seen: seen, proceed: closedChan(), panicOnce: &panicked}
		}}
	node := w.start(withKinds(probe))
	_, err := node.Spots().Send("fragile", wrapperspb.String("1")).InstanceSpot("probe").Do(ctx)
	require.NoError(t, err)
	require.Equal(t, "1 pointer=true", <-seen)
	_, err = request(t, node, "fragile", "2")
	require.NoError(t, err)
	require.Equal(t, "2 pointer=false", <-seen)
	other := w.start(withKinds(probe))
	mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = node.Relocate(mctx, extension.InstanceSpotRef("fragile"), other.NodeRid())
	require.NoError(t, err)
}
