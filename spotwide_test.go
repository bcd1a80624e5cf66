package roam_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/roamerr"
)

// team is a SpotWide User Spot's actor: it counts visits (its state) and
// writes down the members each RelocationReady callback named, which
// "ready" answers.
type team struct {
	visits int64
	ready  []string
}

func (s *team) Receive(c actor.Context) {
	if m, ok := c.Message().(*wrapperspb.StringValue); ok {
		switch m.GetValue() {
		case "ready":
			c.Respond(wrapperspb.String(strings.Join(s.ready, ";")))
		default:
			s.visits++
			c.Respond(wrapperspb.Int64(s.visits))
		}
	}
}

func (s *team) OnRelocationReady(members []location.AuthorityKey) {
	ids := make([]string, len(members))
	for i, m := range members {
		ids[i] = m.ID
	}
	s.ready = append(s.ready, strings.Join(ids, ","))
}

func (s *team) CaptureState() ([]byte, error) {
	return proto.Marshal(wrapperspb.String(fmt.Sprintf("%d|%s", s.visits, strings.Join(s.ready, ";"))))
}

func (s *team) RestoreState(b []byte) error {
	var v wrapperspb.StringValue
	if err := proto.Unmarshal(b, &v); err != nil {
		return err
	}
	n, ready, _ := strings.Cut(v.GetValue(), "|")
	_, err := fmt.Sscan(n, &s.visits)
	if ready != "" {
		s.ready = strings.Split(ready, ";")
	}
	return err
}

var teamKind = roam.NewKind("team", actor.PropsFromProducer(func() actor.Actor { return &team{} }), roam.PreserveState(), roam.SpotWide())

func spotCall(t *testing.T, r *roam.Roam, id, what string) proto.Message {
	t.Helper()
	res, err := r.Spots().Request(context.Background(), id, wrapperspb.String(what))
	require.NoError(t, err)
	return res
}

// A SpotWide User Spot moves with every member as one unit while callers
// keep sending to all of them: one commit changes every owner (the Spot's
// count unchanged), each participant's state and queue arrive, nothing is
// lost or handled twice, and the Spot's RelocationReady callback names
// the members that came with it. A member never moves alone, and members
// are spawned only on the Spot's node.
// Reference: docs/PROTOCOL.md §5.15.
func TestSpotWideUserSpotMovesWithItsMembers(t *testing.T) {
	bothStores(t, func(t *testing.T, store location.Store) {
		ctx := context.Background()
		j := journalKind(store)
		a := start(t, store, roam.WithNodeName("node-a"), roam.WithKinds(j, teamKind))
		b := start(t, store, roam.WithNodeName("node-b"), roam.WithKinds(j, teamKind))
		res, err := a.Spots().GetOrCreate(ctx, "crew", "team")
		require.NoError(t, err)
		home, away := a, b
		if res.Ref.NodeRid != a.NodeRid() {
			home, away = b, a
		}
		members := []string{"m1", "m2", "m3"}
		for _, id := range members {
			_, err := home.Spots().SpawnMember(ctx, res.Ref, "journal", id)
			require.NoError(t, err)
		}
		_, err = away.Spots().SpawnMember(ctx, res.Ref, "journal", "elsewhere")
		require.ErrorIs(t, err, roamerr.ErrInvalidOperation, "a SpotWide Spot's members live on its node")
		require.EqualValues(t, 3, memberCount(t, store, "crew"))
		_, err = away.Relocate(ctx, roam.ActorRef("m1"), away.NodeName())
		require.ErrorIs(t, err, roamerr.ErrInvalidOperation, "a member moves only with its Spot")
		require.EqualValues(t, 1, spotCall(t, away, "crew", "visit").(*wrapperspb.Int64Value).GetValue())

		// Callers on both nodes send to every member and the Spot while it
		// moves.
		const sends = 40
		var wg sync.WaitGroup
		for _, via := range []*roam.Roam{a, b} {
			for _, id := range members {
				pid, err := via.Resolve(ctx, roam.ActorRef(id))
				require.NoError(t, err)
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range sends {
						via.System().Root.Send(pid, wrapperspb.String("tick"))
					}
				}()
			}
		}
		out, err := away.Relocate(ctx, roam.UserSpotRef("crew"), away.NodeName())
		require.NoError(t, err)
		require.Equal(t, away.NodeRid(), out.To)
		wg.Wait()

		owners := unitOwners(t, store)
		for _, id := range members {
			require.Equal(t, away.NodeRid(), owners[roam.ActorRef(id)], "%s moved with its Spot", id)
		}
		v, err := store.Read(ctx, roam.UserSpotRef("crew"))
		require.NoError(t, err)
		require.Equal(t, away.NodeRid(), v.Record.GetOwner().GetNodeRid())
		require.EqualValues(t, 3, v.Record.GetMemberCount())
		require.EqualValues(t, 2, spotCall(t, home, "crew", "visit").(*wrapperspb.Int64Value).GetValue(), "the Spot's state moved")
		require.Equal(t, "m1,m2,m3", spotCall(t, home, "crew", "ready").(*wrapperspb.StringValue).GetValue(),
			"one RelocationReady callback, naming the members")
		for _, id := range members {
			testwait.For(t, func() bool { return count(journalOf(t, home, roam.ActorRef(id)), "tick") >= 2*sends },
				id+" did not handle every send")
			require.Equal(t, 2*sends, count(journalOf(t, home, roam.ActorRef(id)), "tick"), "%s: nothing lost or handled twice", id)
		}

		// And back, from the other side.
		_, err = home.Relocate(ctx, roam.UserSpotRef("crew"), home.NodeName())
		require.NoError(t, err)
		owners = unitOwners(t, store)
		var at []string
		for _, id := range members {
			at = append(at, owners[roam.ActorRef(id)])
		}
		sort.Strings(at)
		require.Equal(t, []string{home.NodeRid(), home.NodeRid(), home.NodeRid()}, at)
		require.Equal(t, 2*sends, count(journalOf(t, away, roam.ActorRef("m2")), "tick"))
	})
}

// ownerWrites records, for one node's store client, every write that
// changes the owner of a record: which keys each write names.
type ownerWrites struct {
	location.Store
	mu     sync.Mutex
	writes [][]location.AuthorityKey
}

func (s *ownerWrites) note(ctx context.Context, ops []location.Op) {
	var keys []location.AuthorityKey
	for _, op := range ops {
		if op.Kind != location.OpUpdate || op.Record == nil {
			continue
		}
		cur, err := s.Store.Read(ctx, op.Key)
		if err == nil && cur.Record.GetOwner().GetNodeRid() != op.Record.GetOwner().GetNodeRid() {
			keys = append(keys, op.Key)
		}
	}
	if len(keys) > 0 {
		s.mu.Lock()
		s.writes = append(s.writes, keys)
		s.mu.Unlock()
	}
}

func (s *ownerWrites) Apply(ctx context.Context, ops []location.Op) ([]location.StoreVersion, error) {
	s.note(ctx, ops)
	return s.Store.Apply(ctx, ops)
}

func (s *ownerWrites) CompareAndSet(ctx context.Context, key location.AuthorityKey, v location.StoreVersion, rec *location.Record) (location.StoreVersion, error) {
	s.note(ctx, []location.Op{location.UpdateOp(key, v, rec)})
	return s.Store.CompareAndSet(ctx, key, v, rec)
}

func (s *ownerWrites) all() [][]location.AuthorityKey {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([][]location.AuthorityKey(nil), s.writes...)
}

// PerActor and SpotWide moves change owners the same way: only the target
// writes, with one compare-and-set — for a SpotWide unit, one transaction
// naming the Spot and every member; the source never writes an owner.
// Reference: docs/PROTOCOL.md §5.11, §5.15, §12.1 item 17.
func TestPerActorAndSpotWideUseTheSameTargetOnlyCAS(t *testing.T) {
	bothStores(t, func(t *testing.T, store location.Store) {
		ctx := context.Background()
		j := journalKind(store)
		house := roam.NewKind("clubhouse", actor.PropsFromProducer(func() actor.Actor { return &counter{} }), roam.PreserveState())
		sa, sb := &ownerWrites{Store: store}, &ownerWrites{Store: store}
		roots := roam.WithRoots(store.(location.RootStore))
		a := start(t, sa, roam.WithNodeName("node-a"), roam.WithKinds(j, teamKind, house), roots)
		b := start(t, sb, roam.WithNodeName("node-b"), roam.WithKinds(j, teamKind, house), roots)
		crew, club := spotOnNode(t, "crew", "team", a, b), spotOnNode(t, "club", "clubhouse", a, b)
		for _, id := range []string{"w1", "w2"} {
			_, err := a.Spots().SpawnMember(ctx, crew, "journal", id)
			require.NoError(t, err)
		}
		_, err := a.Spots().SpawnMember(ctx, club, "journal", "p1")
		require.NoError(t, err)
		before := len(sa.all())

		// PerActor: the Spot, then its member, each one CAS by b.
		_, err = a.Relocate(ctx, roam.UserSpotRef("club"), "node-b")
		require.NoError(t, err)
		_, err = a.Relocate(ctx, roam.ActorRef("p1"), "node-b")
		require.NoError(t, err)
		// SpotWide: one transaction by b naming the Spot and both members.
		out, err := a.Relocate(ctx, roam.UserSpotRef("crew"), "node-b")
		require.NoError(t, err)

		require.Len(t, sa.all(), before, "the source never writes an owner")
		writes := sb.all()
		require.Equal(t, [][]location.AuthorityKey{
			{roam.UserSpotRef("club")},
			{roam.ActorRef("p1")},
			{roam.UserSpotRef("crew"), roam.ActorRef("w1"), roam.ActorRef("w2")},
		}, writes[len(writes)-3:])
		for _, k := range []location.AuthorityKey{roam.UserSpotRef("crew"), roam.ActorRef("w1"), roam.ActorRef("w2")} {
			v, err := store.Read(ctx, k)
			require.NoError(t, err)
			require.Equal(t, out.RelocationID, v.Record.GetRelocationId(), "%s changed by the unit's commit", k)
		}
	})
}

// A SpotWide move the target refuses before relay-ready (it does not host
// a member's kind) changes nothing: the Spot and every member serve on at
// the source with their state and every message. A unit above
// MaxSpotWideMembers is refused before anything seals.
// Reference: docs/PROTOCOL.md §5.15, §6.2.
func TestRefusedSpotWideMoveLeavesEveryParticipantServing(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	j := journalKind(store)
	a := start(t, store, roam.WithNodeName("node-a"), roam.WithKinds(j, teamKind))
	b := start(t, store, roam.WithNodeName("node-b"), roam.WithKinds(teamKind)) // no journal
	crew := spotOnNode(t, "crew", "team", a, b)
	pid, err := a.Spots().SpawnMember(ctx, crew, "journal", "w1")
	require.NoError(t, err)
	for range 5 {
		a.System().Root.Send(pid, wrapperspb.String("tick"))
	}
	_, err = a.Relocate(ctx, roam.UserSpotRef("crew"), "node-b")
	require.Error(t, err)
	require.Equal(t, a.NodeRid(), unitOwners(t, store)[roam.ActorRef("w1")])
	v, err := store.Read(ctx, roam.UserSpotRef("crew"))
	require.NoError(t, err)
	require.Equal(t, a.NodeRid(), v.Record.GetOwner().GetNodeRid())
	require.EqualValues(t, 1, spotCall(t, b, "crew", "visit").(*wrapperspb.Int64Value).GetValue(), "the Spot serves on")
	require.Equal(t, 5, count(journalOf(t, a, roam.ActorRef("w1")), "tick"), "the member serves on with every message")

	for i := range roam.MaxSpotWideMembers {
		_, err := a.Spots().SpawnMember(ctx, crew, "journal", fmt.Sprintf("x%03d", i))
		require.NoError(t, err)
	}
	_, err = a.Relocate(ctx, roam.UserSpotRef("crew"), "node-b")
	require.ErrorIs(t, err, roamerr.ErrCapacityExceeded)
	require.Equal(t, 5, count(journalOf(t, a, roam.ActorRef("w1")), "tick"), "still serving")
}

// Draining a node moves a SpotWide User Spot and its members as one unit
// (the members are not units of their own), with every message.
// Reference: docs/PROTOCOL.md §5.15; docs/OPERATIONS.md (drain).
func TestDrainMovesASpotWideSpotAsOneUnit(t *testing.T) {
	bothStores(t, func(t *testing.T, store location.Store) {
		ctx := context.Background()
		j := journalKind(store)
		a := start(t, store, roam.WithNodeName("node-a"), roam.WithKinds(j, teamKind))
		b := start(t, store, roam.WithNodeName("node-b"), roam.WithKinds(j, teamKind))
		res, err := a.Spots().GetOrCreate(ctx, "crew", "team")
		require.NoError(t, err)
		home, other := a, b
		if res.Ref.NodeRid != a.NodeRid() {
			home, other = b, a
		}
		for _, id := range []string{"w1", "w2", "w3"} {
			pid, err := home.Spots().SpawnMember(ctx, res.Ref, "journal", id)
			require.NoError(t, err)
			for range 10 {
				home.System().Root.Send(pid, wrapperspb.String("tick"))
			}
		}
		result, err := home.Drain(ctx, roam.DrainOptions{})
		require.NoError(t, err)
		require.True(t, result.Complete(), "%+v", result.Failed)
		require.Equal(t, 1, result.Total, "one unit: the Spot with its members")
		for _, id := range []string{"w1", "w2", "w3"} {
			require.Equal(t, other.NodeRid(), unitOwners(t, store)[roam.ActorRef(id)])
			require.Equal(t, 10, count(journalOf(t, other, roam.ActorRef(id)), "tick"))
		}
	})
}

// failingApply is one node's store client whose transactions that fail
// picks never reach the store (Unavailable).
type failingApply struct {
	location.Store
	fail   func(ops []location.Op) bool
	healed atomic.Bool
}

func (s *failingApply) Apply(ctx context.Context, ops []location.Op) ([]location.StoreVersion, error) {
	if !s.healed.Load() && s.fail(ops) {
		return nil, fmt.Errorf("%w: injected", location.ErrUnavailable)
	}
	return s.Store.Apply(ctx, ops)
}

// A SpotWide move whose target never manages to commit (every transaction
// it sends fails) is fenced out by the source past the target's restore
// deadline, and every participant serves on at the source with its state
// and every message sent during the move, each handled once.
// Reference: docs/PROTOCOL.md §5.15, §6.5 (the fence-out).
func TestSpotWideMoveThatNeverCommitsIsFencedOutWhole(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	j := journalKind(store)
	fast := roam.WithRelocationConfig(roam.RelocationConfig{RestoreTimeout: 2 * time.Second})
	a := start(t, store, roam.WithNodeName("node-a"), roam.WithKinds(j, teamKind), fast)
	res, err := a.Spots().GetOrCreate(ctx, "crew", "team")
	require.NoError(t, err)
	require.Equal(t, a.NodeRid(), res.Ref.NodeRid)
	broken := &failingApply{Store: store, fail: func(ops []location.Op) bool {
		for _, op := range ops {
			if op.Key == roam.UserSpotRef("crew") {
				return true
			}
		}
		return false
	}}
	b := start(t, broken, roam.WithNodeName("node-b"), roam.WithKinds(j, teamKind), fast, roam.WithRoots(store))
	members := []string{"w1", "w2"}
	var pids []*actor.PID
	for _, id := range members {
		pid, err := a.Spots().SpawnMember(ctx, res.Ref, "journal", id)
		require.NoError(t, err)
		pids = append(pids, pid)
	}
	const sends = 30
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range sends {
			for _, pid := range pids {
				a.System().Root.Send(pid, wrapperspb.String("tick"))
			}
		}
	}()
	_, err = a.Relocate(ctx, roam.UserSpotRef("crew"), "node-b")
	require.ErrorIs(t, err, roamerr.ErrUnavailable, "fenced out")
	testwait.Recv(t, done, "the senders ended")
	v, err := store.Read(ctx, roam.UserSpotRef("crew"))
	require.NoError(t, err)
	require.Equal(t, a.NodeRid(), v.Record.GetOwner().GetNodeRid())
	for _, id := range members {
		require.Equal(t, a.NodeRid(), unitOwners(t, store)[roam.ActorRef(id)])
		testwait.For(t, func() bool { return count(journalOf(t, b, roam.ActorRef(id)), "tick") >= sends }, id+" lost sends")
		require.Equal(t, sends, count(journalOf(t, b, roam.ActorRef(id)), "tick"), id)
	}
	require.EqualValues(t, 1, spotCall(t, b, "crew", "visit").(*wrapperspb.Int64Value).GetValue())
	// And it moves once the store takes the target's writes again.
	broken.healed.Store(true)
	_, err = a.Relocate(ctx, roam.UserSpotRef("crew"), "node-b")
	require.NoError(t, err)
	require.Equal(t, b.NodeRid(), unitOwners(t, store)[roam.ActorRef("w2")])
}

// A SpotWide Spot moved back at once, while it and its many members are
// still arriving (the Spot's queue open, the members' about to open after
// RelocationReady), starts once they have opened: it never fails for
// that, and never reports an internal state. Its nodes hold leases of
// 15 s, not the package's 2 s: what it checks has nothing to do with
// leases, and on a starved machine a 2 s lease ended mid-run (a move then
// fails Unavailable, which is correct fencing but not this test's case).
// Reference: docs/PROTOCOL.md §5.15.
func TestSpotWideSpotMovesBackWhileItsMembersStillOpen(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	j := journalKind(store)
	a := start(t, store, roam.WithNodeName("node-a"), roam.WithKinds(j, teamKind), roam.WithLeaseTTL(15*time.Second))
	b := start(t, store, roam.WithNodeName("node-b"), roam.WithKinds(j, teamKind), roam.WithLeaseTTL(15*time.Second))
	rids := a.NodeRid() + " " + b.NodeRid()
	crew := spotOnNode(t, "crew", "team", a, b)
	for i := range 100 {
		_, err := a.Spots().SpawnMember(ctx, crew, "journal", fmt.Sprintf("w%03d", i))
		require.NoError(t, err)
	}
	nodes := []*roam.Roam{a, b}
	for m := range 20 {
		from, to := nodes[m%2], nodes[(m+1)%2]
		_, err := from.Relocate(ctx, roam.UserSpotRef("crew"), to.NodeName())
		require.NoError(t, err, "move %d (lifecycles at the start: %s; now: %s %s)", m, rids, a.NodeRid(), b.NodeRid())
	}
	require.Equal(t, a.NodeRid(), unitOwners(t, store)[roam.ActorRef("w042")])
	countsExact(t, store)
}
