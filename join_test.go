package roam_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"

	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// journal is an Actor that writes down what it handled, in order: "tick"
// for each tick (answered with the count so far), and for its Join
// callback "joined <spot>" — with "+committed" when the store already
// showed the membership as it ran (the callback comes after the commit),
// or "+now:<spot>" naming the membership the store showed instead.
// "log" answers the journal. Its journal moves with it.
type journal struct {
	store location.Store
	log   []string
	// ticks counts the "tick" entries, so that a tick's turn costs the
	// same however long the journal grew: a fenced-out move gives its
	// participants back every send it held (thousands, under senders
	// that do not stop), and a turn that reread the whole journal made
	// working them off quadratic, longer than a caller waits.
	ticks int64
}

func (j *journal) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *wrapperspb.StringValue:
		switch m.GetValue() {
		case "log":
			c.Respond(wrapperspb.String(strings.Join(j.log, ",")))
		default:
			j.log = append(j.log, "tick")
			j.ticks++
			c.Respond(wrapperspb.Int64(j.ticks))
		}
	case *roam.JoinedSpot:
		entry := "joined " + m.GetSpotId()
		// The incarnation's name is "roam/actor/<id>@<generations>".
		id, _, _ := strings.Cut(strings.TrimPrefix(c.Self().GetId(), "roam/actor/"), "@")
		v, err := j.store.Read(context.Background(), roam.ActorRef(id))
		switch {
		case err == nil && v.Record.GetMembership().GetSpotId() == m.GetSpotId() && v.Record.GetMembership().GetSpotGeneration() == m.GetSpotGeneration():
			entry += "+committed"
		case err == nil:
			// Another Join committed since (a move sealed the Actor
			// before it handled this callback): the store names it.
			entry += "+now:" + v.Record.GetMembership().GetSpotId()
		}
		j.log = append(j.log, entry)
	}
}

func (j *journal) CaptureState() ([]byte, error) {
	return proto.Marshal(wrapperspb.String(strings.Join(j.log, ",")))
}

func (j *journal) RestoreState(b []byte) error {
	var v wrapperspb.StringValue
	if err := proto.Unmarshal(b, &v); err != nil {
		return err
	}
	if v.GetValue() != "" {
		j.log = strings.Split(v.GetValue(), ",")
	}
	j.ticks = int64(count(j.log, "tick"))
	return nil
}

func journalKind(store location.Store) roam.Kind {
	return roam.NewKind("journal", actor.PropsFromProducer(func() actor.Actor { return &journal{store: store} }), roam.PreserveState())
}

// journalOf asks the Actor ref for its journal.
func journalOf(t *testing.T, r *roam.Roam, ref roam.Ref) []string {
	t.Helper()
	pid, err := r.Resolve(context.Background(), ref)
	require.NoError(t, err)
	res, err := r.System().Root.RequestFuture(pid, wrapperspb.String("log"), testwait.Patience(t)).Result()
	require.NoError(t, err)
	require.NoError(t, roam.DeliveryError(res))
	s := res.(*wrapperspb.StringValue).GetValue()
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func count(entries []string, prefix string) int {
	n := 0
	for _, e := range entries {
		if strings.HasPrefix(e, prefix) {
			n++
		}
	}
	return n
}

// membershipOf is the User Spot (or Entry Spot) the Actor's record names.
func membershipOf(t *testing.T, store location.Store, id string) *messages.Membership {
	t.Helper()
	v, err := store.Read(context.Background(), roam.ActorRef(id))
	require.NoError(t, err)
	return v.Record.GetMembership()
}

// An Actor joins a User Spot on another node from any node: it moves there
// with its state and the sends queued for it, and that node's commit
// changes its owner and both memberships in one transaction (the counts of
// the Spot it leaves and the Spot it joins); its Join callback runs once,
// after the commit. On the Spot's own node the join is one transaction,
// without a move. Joining again changes nothing; a stale Spot ref changes
// nothing and says Stale.
// Reference: docs/PROTOCOL.md §7.10 (cross-node Actor Join).
func TestActorJoinsAUserSpotAcrossNodes(t *testing.T) {
	bothStores(t, func(t *testing.T, store location.Store) {
		ctx := context.Background()
		j := journalKind(store)
		house := roam.NewKind("clubhouse", actor.PropsFromProducer(func() actor.Actor { return &counter{} }), roam.PreserveState())
		lounge := roam.NewKind("lounge", actor.PropsFromProducer(func() actor.Actor { return &counter{} }), roam.PreserveState())
		// The club lives on b (only b hosts its kind), the lounge on a.
		a := start(t, store, roam.WithNodeName("node-a"), roam.WithKinds(j, lounge))
		b := start(t, store, roam.WithNodeName("node-b"), roam.WithKinds(j, house))
		club, err := a.Spots().GetOrCreate(ctx, "club", "clubhouse")
		require.NoError(t, err)
		require.Equal(t, b.NodeRid(), club.Ref.NodeRid)
		hall, err := b.Spots().GetOrCreate(ctx, "hall", "lounge")
		require.NoError(t, err)
		require.Equal(t, a.NodeRid(), hall.Ref.NodeRid)

		pid, err := a.SpawnActor(ctx, "journal", "j1")
		require.NoError(t, err)
		for range 2 {
			_, err := a.System().Root.RequestFuture(pid, wrapperspb.String("tick"), testwait.Patience(t)).Result()
			require.NoError(t, err)
		}
		// Sends queued as the join starts move with the Actor.
		const sends = 50
		for range sends {
			a.System().Root.Send(pid, wrapperspb.String("tick"))
		}
		// Asked on b, the Spot's node; a, the Actor's owner, runs it.
		out, err := b.JoinSpot(ctx, roam.ActorRef("j1"), club.Ref)
		require.NoError(t, err)
		require.Equal(t, a.NodeRid(), out.From)
		require.Equal(t, b.NodeRid(), out.To)
		require.Equal(t, b.NodeRid(), unitOwners(t, store)[roam.ActorRef("j1")])
		require.Equal(t, "club", membershipOf(t, store, "j1").GetSpotId())
		require.EqualValues(t, 1, memberCount(t, store, "club"))
		log := journalOf(t, a, roam.ActorRef("j1"))
		require.Equal(t, 2+sends, count(log, "tick"), "state and queue moved, nothing lost or handled twice: %v", log)
		require.Equal(t, []string{"joined club+committed"}, filter(log, "joined"), "one Join callback, after the commit")

		// Again: already a member, nothing happens.
		out, err = a.JoinSpot(ctx, roam.ActorRef("j1"), club.Ref)
		require.NoError(t, err)
		require.Equal(t, out.From, out.To)
		require.EqualValues(t, 1, memberCount(t, store, "club"))

		// A stale ref (another generation) changes nothing.
		stale := club.Ref
		stale.ObjectGeneration++
		_, err = a.JoinSpot(ctx, roam.ActorRef("j1"), stale)
		require.ErrorIs(t, err, roamerr.ErrStale)
		require.Equal(t, "club", membershipOf(t, store, "j1").GetSpotId())

		// On the Spot's node: one transaction, no move. j2 lives on b.
		_, err = b.SpawnActor(ctx, "journal", "j2")
		require.NoError(t, err)
		out, err = a.JoinSpot(ctx, roam.ActorRef("j2"), club.Ref)
		require.NoError(t, err)
		require.Equal(t, b.NodeRid(), out.To)
		require.Zero(t, out.RelocationID, "no move")
		require.EqualValues(t, 2, memberCount(t, store, "club"))
		testwait.For(t, func() bool { return count(journalOf(t, b, roam.ActorRef("j2")), "joined club+committed") == 1 },
			"j2's Join callback did not run")

		// From one User Spot to another on a third... on a: j1 leaves the
		// club's count and joins the hall's, moving back to a.
		out, err = a.JoinSpot(ctx, roam.ActorRef("j1"), hall.Ref)
		require.NoError(t, err)
		require.Equal(t, a.NodeRid(), out.To)
		require.EqualValues(t, 1, memberCount(t, store, "club"))
		require.EqualValues(t, 1, memberCount(t, store, "hall"))
		log = journalOf(t, b, roam.ActorRef("j1"))
		require.Equal(t, []string{"joined club+committed", "joined hall+committed"}, filter(log, "joined"))
		require.Equal(t, 2+sends, count(log, "tick"))
	})
}

func filter(entries []string, prefix string) []string {
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e, prefix) {
			out = append(out, e)
		}
	}
	return out
}

// applyHook is a memstore whose next Apply that hook picks runs hook
// first: a change by another node that lands exactly before that write.
type applyHook struct {
	*memstore.Store
	hook atomic.Pointer[func(ops []location.Op) bool]
}

func (s *applyHook) Apply(ctx context.Context, ops []location.Op) ([]location.StoreVersion, error) {
	if h := s.hook.Load(); h != nil && (*h)(ops) {
		s.hook.Store(nil)
	}
	return s.Store.Apply(ctx, ops)
}

// A Join whose User Spot closes after the target admitted it, before the
// commit: the move is past relay-ready and commits all the same, without
// the Join — the Actor serves on at the target as its Entry Spot's member,
// with its state; no count changes and no Join callback runs; JoinSpot
// says Stale.
// Reference: docs/PROTOCOL.md §7.10.
func TestJoinWhoseSpotClosesBeforeTheCommitMovesWithoutJoining(t *testing.T) {
	ctx := context.Background()
	store := &applyHook{Store: memstore.New()}
	j := journalKind(store)
	house := roam.NewKind("clubhouse", actor.PropsFromProducer(func() actor.Actor { return &counter{} }), roam.PreserveState())
	a := start(t, store, roam.WithNodeName("node-a"), roam.WithKinds(j))
	b := start(t, store, roam.WithNodeName("node-b"), roam.WithKinds(j, house))
	club, err := a.Spots().GetOrCreate(ctx, "club", "clubhouse")
	require.NoError(t, err)
	require.Equal(t, b.NodeRid(), club.Ref.NodeRid)
	pid, err := a.SpawnActor(ctx, "journal", "j1")
	require.NoError(t, err)
	_, err = a.System().Root.RequestFuture(pid, wrapperspb.String("tick"), testwait.Patience(t)).Result()
	require.NoError(t, err)

	var closed atomic.Bool
	hook := func(ops []location.Op) bool {
		for _, op := range ops {
			if op.Key == roam.ActorRef("j1") && op.Record.GetMembership().GetSpotId() == "club" {
				ok, err := b.Spots().Close(ctx, club.Ref)
				closed.Store(err == nil && ok)
				return true
			}
		}
		return false
	}
	store.hook.Store(&hook)
	out, err := a.JoinSpot(ctx, roam.ActorRef("j1"), club.Ref)
	require.ErrorIs(t, err, roamerr.ErrStale)
	require.True(t, closed.Load(), "the club closed in the window")
	require.Equal(t, b.NodeRid(), out.To)
	require.Equal(t, b.NodeRid(), unitOwners(t, store)[roam.ActorRef("j1")], "the move committed")
	rec, err := store.Read(ctx, roam.ActorRef("j1"))
	require.NoError(t, err)
	require.NotEqual(t, "club", rec.Record.GetMembership().GetSpotId())
	log := journalOf(t, b, roam.ActorRef("j1"))
	require.Equal(t, []string{"tick"}, log, "state moved; no Join callback")
}
