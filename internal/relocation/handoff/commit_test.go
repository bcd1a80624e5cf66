package handoff

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

var (
	objKey   = location.Key(location.KindActor, "a1")
	spotKey  = location.Key(location.KindUserSpot, "s1")
	leftKey  = location.Key(location.KindUserSpot, "s0")
	selfNode = location.NodeKey{Mesh: "m", NodeRid: "me"}
	srcOwner = &messages.Owner{Mesh: "m", NodeRid: "src", NodeGeneration: 1}
)

// commitOf is the commit of testID's object, an Actor, into node "me".
func commitOf() *Commit {
	return &Commit{
		ID: testID, Key: objKey, Owner: &messages.Owner{Mesh: "m", NodeRid: "me", NodeGeneration: 4},
		NewOwnerGeneration: 9, ObjectGeneration: 1, Session: &messages.SessionBinding{SessionId: "sess"},
		RestoreDeadline: deadline, EntrySpotID: "me-entry-1",
		IsEntrySpot:   func(id string) bool { return strings.Contains(id, "-entry-") },
		SourceNodeRid: "src", SourceNodeGeneration: 1, Node: selfNode, Lease: "lease-me",
	}
}

// atFence is the object's record at the move's fence, version 5.
func atFence() location.Versioned {
	return location.Versioned{Key: objKey, Version: 5, Record: &location.Record{
		ObjectGeneration: 1, AuthorityOwnerGeneration: 3, State: messages.LifecycleState_LIFECYCLE_STATE_READY,
		Owner: srcOwner, SessionId: "sess", SessionOwnerAddress: "host:1",
	}}
}

// with is v's record changed by f, at version.
func with(v location.Versioned, version location.StoreVersion, f func(r *location.Record)) location.Versioned {
	r := proto.Clone(v.Record).(*location.Record)
	f(r)
	return location.Versioned{Key: v.Key, Version: version, Record: r}
}

// committedRecord is the record a commit of testID by "me" wrote.
func committedRecord() location.Versioned {
	return with(atFence(), 6, func(r *location.Record) {
		r.Owner, r.AuthorityOwnerGeneration, r.RelocationId = &messages.Owner{NodeRid: "me"}, 9, testID.RelocationID
	})
}

// composed runs a transaction to its end, answering each read from recs
// (a key missing there reads absent), and returns its ops.
func composed(t *testing.T, c *Commit, v location.Versioned, recs map[location.AuthorityKey]location.Versioned) ([]location.Op, Committed, [][]location.AuthorityKey) {
	t.Helper()
	x := c.Txn(v)
	var asked [][]location.AuthorityKey
	for keys := x.Needs(); len(keys) > 0; keys = x.Needs() {
		asked = append(asked, keys)
		vs := make([]location.Versioned, len(keys))
		for i, k := range keys {
			vs[i] = recs[k]
		}
		require.Nil(t, x.Read(vs))
		require.Less(t, len(asked), 4, "the transaction keeps asking")
	}
	ops, got := x.Ops()
	return ops, got, asked
}

// The plain owner commit is one CAS at the version read: this node, the
// new owner generation and the move's RelocationId; the rest of the
// record stays.
func TestCommitOfAnActorIsItsOwnerCASAlone(t *testing.T) {
	c := commitOf()
	v := atFence()
	ev, _ := c.Read(v)
	require.Nil(t, ev)
	ops, got, asked := composed(t, c, v, nil)
	require.Empty(t, asked)
	want := with(v, 5, func(r *location.Record) {
		r.Owner, r.AuthorityOwnerGeneration, r.RelocationId = c.Owner, 9, testID.RelocationID
	})
	require.Equal(t, []location.Op{location.UpdateOp(objKey, 5, want.Record)}, ops)
	require.Equal(t, Committed{}, got)
	require.Equal(t, "src", v.Record.GetOwner().GetNodeRid(), "the record read is not written")
}

// A move whose source sent no Session binding (it dropped it, the Session
// gone) clears the record's.
func TestCommitDropsTheBindingTheSourceDropped(t *testing.T) {
	c := commitOf()
	c.Session = nil
	ops, _, _ := composed(t, c, atFence(), nil)
	require.Empty(t, ops[0].Record.GetSessionId())
	require.Empty(t, ops[0].Record.GetSessionOwnerAddress())

	ops, _, _ = composed(t, commitOf(), atFence(), nil)
	require.Equal(t, "sess", ops[0].Record.GetSessionId(), "a binding sent along stays")
}

// An Actor of an Entry Spot joins the target's Entry Spot; a User Spot's
// member keeps its membership, and the commit says so.
func TestCommitMovesAnEntrySpotActorToTheTargetsEntrySpot(t *testing.T) {
	v := with(atFence(), 5, func(r *location.Record) {
		r.Membership = &messages.Membership{SpotId: "src-entry-1", SpotGeneration: 1}
	})
	ops, got, _ := composed(t, commitOf(), v, nil)
	require.Equal(t, &messages.Membership{SpotId: "me-entry-1", SpotGeneration: 1}, ops[0].Record.GetMembership())
	require.Nil(t, got.Member)

	member := &messages.Membership{SpotId: "s0", SpotGeneration: 2}
	v = with(atFence(), 5, func(r *location.Record) { r.Membership = member })
	ops, got, _ = composed(t, commitOf(), v, nil)
	require.True(t, proto.Equal(member, ops[0].Record.GetMembership()))
	require.True(t, proto.Equal(member, got.Member))
}

// The record read decides before anything is written: this move's own
// earlier write (committed, with what it carried), a fence-out, another
// owner, no record, and — never an owner over it — a Closing record.
func TestCommitJudgesTheRecordRead(t *testing.T) {
	join := &messages.Membership{SpotId: "s1", SpotGeneration: 2}
	mine := with(committedRecord(), 6, func(r *location.Record) { r.Membership = join })
	cases := []struct {
		name   string
		v      location.Versioned
		settle bool
		want   Event
		got    Committed
	}{
		{"at the fence", atFence(), false, nil, Committed{}},
		{"committed by this move with the Join", mine, false, StoreCommitted{}, Committed{Joined: true, Member: join}},
		{"committed by this move, settling", mine, true, StoreCommitted{}, Committed{Joined: true, Member: join}},
		{"fenced out", with(atFence(), 6, func(r *location.Record) { r.RelocationId = testID.RelocationID }), false, StoreStale{}, Committed{}},
		{"another owner", with(atFence(), 6, func(r *location.Record) { r.AuthorityOwnerGeneration = 4 }), false, StoreStale{}, Committed{}},
		{"closing", with(atFence(), 6, func(r *location.Record) { r.State = messages.LifecycleState_LIFECYCLE_STATE_CLOSING }), false, StoreRetryable{}, Committed{}},
		{"closing, settling: the fence-out goes on", with(atFence(), 6, func(r *location.Record) { r.State = messages.LifecycleState_LIFECYCLE_STATE_CLOSING }), true, nil, Committed{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := commitOf()
			c.Join, c.SettleOnly = join, tc.settle
			ev, got := c.Read(tc.v)
			if tc.want == nil {
				require.Nil(t, ev)
			} else {
				require.IsType(t, tc.want, ev)
			}
			require.Equal(t, tc.got.Joined, got.Joined)
			require.True(t, proto.Equal(tc.got.Member, got.Member))
		})
	}
	ev := commitOf().ReadMissing()
	require.IsType(t, StoreStale{}, ev)
}

// Settling writes no owner: the record read, with the move's
// RelocationId, at its version, bounded by a restore timeout from now (the
// restore deadline has passed), at a fresh read's version.
func TestSettlingFencesTheMoveOut(t *testing.T) {
	c := commitOf()
	c.SettleOnly = true
	v := atFence()
	op := c.FenceOut(v)
	want := with(v, 5, func(r *location.Record) { r.RelocationId = testID.RelocationID })
	require.Equal(t, location.UpdateOp(objKey, 5, want.Record), op)
	now := deadline.Add(time.Second)
	require.Equal(t, now.Add(2*time.Second), c.Deadline(now, 2*time.Second))
	require.False(t, c.ReusesVerified(), "an earlier CAS may have written since VerifySource read")

	c.SettleOnly = false
	require.Equal(t, deadline, c.Deadline(now, 2*time.Second))
	require.True(t, c.ReusesVerified())
}

// The store's answer to the write, judged.
func TestCommitJudgesTheStoresAnswer(t *testing.T) {
	conflict := func(cur ...location.Versioned) error { return &location.ConflictError{Op: "cas", Current: cur} }
	wrote := Committed{Joined: true, Member: &messages.Membership{SpotId: "s1", SpotGeneration: 2}}
	cases := []struct {
		name string
		err  error
		want Event
		got  Committed
	}{
		{"applied", nil, StoreCommitted{}, wrote},
		{"conflict: this move's earlier write", conflict(committedRecord()), StoreCommitted{}, Committed{}},
		{"conflict: still at the fence", conflict(with(atFence(), 6, func(*location.Record) {})), StoreRetryable{Conflict: true}, Committed{}},
		{"conflict: another key's record only", conflict(location.Versioned{Key: spotKey, Version: 3, Record: &location.Record{}}), StoreRetryable{Conflict: true}, Committed{}},
		{"conflict: fenced out", conflict(with(atFence(), 6, func(r *location.Record) { r.RelocationId = testID.RelocationID })), StoreStale{}, Committed{}},
		{"conflict: no current record", conflict(), StoreRetryable{Conflict: true}, Committed{}},
		{"lease ended", fmt.Errorf("write: %w", location.ErrLeaseEnded), StoreStale{}, Committed{}},
		{"indeterminate", fmt.Errorf("write: %w", location.ErrIndeterminate), StoreRetryable{Unknown: true}, Committed{}},
		{"the caller's deadline", context.DeadlineExceeded, StoreRetryable{Unknown: true}, Committed{}},
		{"unavailable", fmt.Errorf("%w: down", roamerr.ErrUnavailable), StoreRetryable{}, Committed{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ev, got := commitOf().Answer(tc.err, StoreCommitted{}, wrote)
			require.IsType(t, tc.want, ev)
			if r, ok := tc.want.(StoreRetryable); ok {
				require.Equal(t, r.Conflict, ev.(StoreRetryable).Conflict, "conflict")
				require.Equal(t, r.Unknown, ev.(StoreRetryable).Unknown, "outcome unknown")
				require.ErrorIs(t, ev.(StoreRetryable).Err, tc.err)
			}
			require.Equal(t, tc.got, got)
		})
	}
	ev, _ := commitOf().Answer(nil, StoreNotCommitted{}, Committed{})
	require.Equal(t, StoreNotCommitted{}, ev, "a settling fence-out that applied")

	// Settling, the fence-out's conflict shows an earlier CAS of this move
	// applied after the read: committed, with the Join that CAS carried.
	c := commitOf()
	c.SettleOnly = true
	c.Join = &messages.Membership{SpotId: "s1", SpotGeneration: 2}
	cur := with(committedRecord(), 7, func(r *location.Record) { r.Membership = c.Join })
	ev, got := c.Answer(conflict(cur), StoreNotCommitted{}, Committed{})
	require.Equal(t, StoreCommitted{}, ev)
	require.True(t, got.Joined)
	require.True(t, proto.Equal(c.Join, got.Member))
}

// A cross-node Join: the joined Spot's count one more and the left
// Spot's one less, at the versions read, in the owner's transaction.
func TestCommitCarriesTheJoin(t *testing.T) {
	c := commitOf()
	c.Join = &messages.Membership{SpotId: "s1", SpotGeneration: 2}
	v := with(atFence(), 5, func(r *location.Record) { r.Membership = &messages.Membership{SpotId: "s0", SpotGeneration: 7} })
	spot := location.Versioned{Key: spotKey, Version: 11, Record: &location.Record{ObjectGeneration: 2, State: messages.LifecycleState_LIFECYCLE_STATE_READY, Owner: c.Owner, MemberCount: 3}}
	left := location.Versioned{Key: leftKey, Version: 12, Record: &location.Record{ObjectGeneration: 7, MemberCount: 1}}
	ops, got, asked := composed(t, c, v, map[location.AuthorityKey]location.Versioned{spotKey: spot, leftKey: left})
	require.Equal(t, [][]location.AuthorityKey{{spotKey}, {leftKey}}, asked)
	require.Len(t, ops, 3)
	require.True(t, proto.Equal(c.Join, ops[0].Record.GetMembership()))
	require.Equal(t, location.UpdateOp(leftKey, 12, &location.Record{ObjectGeneration: 7, MemberCount: 0}).Version, ops[1].Version)
	require.Equal(t, leftKey, ops[1].Key)
	require.EqualValues(t, 0, ops[1].Record.GetMemberCount())
	require.Equal(t, spotKey, ops[2].Key)
	require.EqualValues(t, 11, ops[2].Version)
	require.EqualValues(t, 4, ops[2].Record.GetMemberCount())
	require.True(t, got.Joined)
	require.True(t, proto.Equal(c.Join, got.Member))

	// A left Spot of another generation (released, created anew) has no
	// count to lower; an Actor in no User Spot reads none.
	left.Record.ObjectGeneration = 8
	ops, got, _ = composed(t, c, v, map[location.AuthorityKey]location.Versioned{spotKey: spot, leftKey: left})
	require.Len(t, ops, 2)
	require.True(t, got.Joined)
	ops, _, asked = composed(t, c, atFence(), map[location.AuthorityKey]location.Versioned{spotKey: spot})
	require.Equal(t, [][]location.AuthorityKey{{spotKey}}, asked)
	require.Len(t, ops, 2)

	// Already a member of that incarnation: nothing to read or count.
	already := with(atFence(), 5, func(r *location.Record) { r.Membership = c.Join })
	ops, got, asked = composed(t, c, already, nil)
	require.Empty(t, asked)
	require.Len(t, ops, 1)
	require.True(t, got.Joined)

	// A read that fails: the attempt retries; the left Spot's read failing
	// is Unavailable.
	x := c.Txn(v)
	require.IsType(t, StoreRetryable{}, x.ReadFailed(location.ErrIndeterminate))
	require.Nil(t, x.Read([]location.Versioned{spot}))
	ev := x.ReadFailed(location.ErrIndeterminate)
	require.ErrorIs(t, ev.(StoreRetryable).Err, roamerr.ErrUnavailable)
}

// The joined Spot no longer takes the Actor — closing, gone, of another
// generation, owned elsewhere —: the move commits without the Join, the
// Actor keeps its membership.
func TestCommitWithoutTheJoinTheSpotNoLongerTakes(t *testing.T) {
	c := commitOf()
	c.Join = &messages.Membership{SpotId: "s1", SpotGeneration: 2}
	ready := location.Versioned{Key: spotKey, Version: 11, Record: &location.Record{ObjectGeneration: 2, State: messages.LifecycleState_LIFECYCLE_STATE_READY, Owner: c.Owner}}
	for name, spot := range map[string]location.Versioned{
		"closing":          with(ready, 11, func(r *location.Record) { r.State = messages.LifecycleState_LIFECYCLE_STATE_CLOSING }),
		"gone":             {},
		"a new generation": with(ready, 11, func(r *location.Record) { r.ObjectGeneration = 3 }),
		"owned elsewhere":  with(ready, 11, func(r *location.Record) { r.Owner = srcOwner }),
	} {
		t.Run(name, func(t *testing.T) {
			member := &messages.Membership{SpotId: "s0", SpotGeneration: 7}
			v := with(atFence(), 5, func(r *location.Record) { r.Membership = member })
			x := c.Txn(v)
			require.Equal(t, []location.AuthorityKey{spotKey}, x.Needs())
			require.Nil(t, x.Read([]location.Versioned{spot}))
			require.Empty(t, x.Needs(), "nothing to leave")
			require.True(t, x.JoinRefused())
			ops, got := x.Ops()
			require.Len(t, ops, 1)
			require.True(t, proto.Equal(member, ops[0].Record.GetMembership()))
			require.False(t, got.Joined)
		})
	}
}

// spotWide is the commit of SpotWide Spot s1 (generation 1) with two
// members, and the members' records at their fences.
func spotWide() (*Commit, location.Versioned, []location.Versioned) {
	c := commitOf()
	c.Key = spotKey
	m := []location.AuthorityKey{location.Key(location.KindActor, "m1"), location.Key(location.KindActor, "m2")}
	c.Members = []CommitMember{
		{Key: m[0], OwnerGeneration: 4, NewOwnerGeneration: 5, ObjectGeneration: 1, Session: &messages.SessionBinding{SessionId: "x"}},
		{Key: m[1], OwnerGeneration: 6, NewOwnerGeneration: 7, ObjectGeneration: 2},
	}
	spot := atFence()
	spot.Key = spotKey
	vs := make([]location.Versioned, 2)
	for i, mm := range c.Members {
		vs[i] = location.Versioned{Key: mm.Key, Version: location.StoreVersion(20 + i), Record: &location.Record{
			Owner: srcOwner, AuthorityOwnerGeneration: mm.OwnerGeneration, ObjectGeneration: mm.ObjectGeneration,
			Membership: &messages.Membership{SpotId: "s1", SpotGeneration: 1}, SessionId: "y",
		}}
	}
	return c, spot, vs
}

func recs(vs []location.Versioned) map[location.AuthorityKey]location.Versioned {
	out := map[location.AuthorityKey]location.Versioned{}
	for _, v := range vs {
		out[v.Key] = v
	}
	return out
}

// A SpotWide move commits every member's owner in the Spot's transaction,
// each at the version read, in participant order.
func TestSpotWideCommitChangesEveryMembersOwner(t *testing.T) {
	c, spot, vs := spotWide()
	ops, _, asked := composed(t, c, spot, recs(vs))
	require.Equal(t, [][]location.AuthorityKey{{c.Members[0].Key, c.Members[1].Key}}, asked)
	require.Len(t, ops, 3)
	for i, m := range c.Members {
		op := ops[i+1]
		require.Equal(t, location.UpdateOp(m.Key, vs[i].Version, op.Record), op)
		require.Equal(t, "me", op.Record.GetOwner().GetNodeRid())
		require.Equal(t, m.NewOwnerGeneration, op.Record.GetAuthorityOwnerGeneration())
		require.Equal(t, testID.RelocationID, op.Record.GetRelocationId())
	}
	require.Equal(t, "y", ops[1].Record.GetSessionId())
	require.Empty(t, ops[2].Record.GetSessionId(), "member 2 came without its binding")
}

// A member whose record left the move's fence makes the whole move stale:
// nothing of it is written.
func TestSpotWideCommitIsStaleOnAMembersConflict(t *testing.T) {
	for name, f := range map[string]func(r *location.Record){
		"another owner generation":  func(r *location.Record) { r.AuthorityOwnerGeneration++ },
		"another owner node":        func(r *location.Record) { r.Owner = &messages.Owner{NodeRid: "other", NodeGeneration: 1} },
		"another object generation": func(r *location.Record) { r.ObjectGeneration++ },
		"left the Spot":             func(r *location.Record) { r.Membership = &messages.Membership{SpotId: "s9", SpotGeneration: 1} },
		"of another Spot generation": func(r *location.Record) {
			r.Membership = &messages.Membership{SpotId: "s1", SpotGeneration: 2}
		},
	} {
		t.Run(name, func(t *testing.T) {
			c, spot, vs := spotWide()
			vs[1] = with(vs[1], vs[1].Version, f)
			x := c.Txn(spot)
			ev := x.Read(vs)
			require.IsType(t, StoreStale{}, ev)
			require.ErrorIs(t, ev.(StoreStale).Err, roamerr.ErrStale)
			require.Error(t, c.VerifyMembers(spot.Record, vs, false), "VerifySource refuses it too")
		})
	}
	c, spot, vs := spotWide()
	vs[0] = location.Versioned{}
	require.IsType(t, StoreStale{}, c.Txn(spot).Read(vs), "a member without a record")
}

// Capacity slots: each participant's slot taken ahead turns active and its
// record names it; the slot its source's record names is freed, in the
// same transaction. A participant past the slots taken names none.
func TestCommitActivatesTheSlotsTakenAheadAndFreesTheSources(t *testing.T) {
	c, spot, vs := spotWide()
	c.Slots = []uint32{4, 5, 6}
	spot = with(spot, 5, func(r *location.Record) { r.CapacitySlot = 3 }) // source slot 2
	vs[1] = with(vs[1], vs[1].Version, func(r *location.Record) { r.CapacitySlot = 1 })
	ops, _, _ := composed(t, c, spot, recs(vs))
	src := location.NodeKey{Mesh: "m", NodeRid: "src"}
	want := []location.Op{
		ops[0], location.FreeSlotOp(src, 2), location.SetSlotOp(selfNode, "lease-me", 4, spotKey, false),
		ops[3], location.SetSlotOp(selfNode, "lease-me", 5, c.Members[0].Key, false),
		ops[5], location.FreeSlotOp(src, 0), location.SetSlotOp(selfNode, "lease-me", 6, c.Members[1].Key, false),
	}
	require.Equal(t, want, ops)
	require.EqualValues(t, 5, ops[0].Record.GetCapacitySlot())
	require.EqualValues(t, 6, ops[3].Record.GetCapacitySlot())
	require.EqualValues(t, 7, ops[5].Record.GetCapacitySlot())

	// An unbounded node took none: the record names no slot here, the
	// source's is still freed.
	c.Slots = nil
	ops, _, _ = composed(t, c, spot, recs(vs))
	require.EqualValues(t, 0, ops[0].Record.GetCapacitySlot())
	require.Equal(t, location.FreeSlotOp(src, 2), ops[1])
	require.Len(t, ops, 5)
}

// VerifySource refuses a SpotWide move whose commit would not fit in one
// store transaction: the lease check, and per participant its owner
// change, the slot's activation on a bounded node, and the freeing of the
// source's slot.
func TestVerifyMembersCountsTheCommitsOps(t *testing.T) {
	c, spot, _ := spotWide()
	// n members on a bounded node, each with a source slot: 1 + 3(n+1).
	n := (location.MaxApplyOps-1)/3 - 1
	c.Members = nil
	var vs []location.Versioned
	for i := range n {
		k := location.Key(location.KindActor, fmt.Sprintf("m%d", i))
		c.Members = append(c.Members, CommitMember{Key: k, OwnerGeneration: 4, ObjectGeneration: 1})
		vs = append(vs, location.Versioned{Key: k, Version: 9, Record: &location.Record{Owner: srcOwner, AuthorityOwnerGeneration: 4, ObjectGeneration: 1,
			Membership: &messages.Membership{SpotId: "s1", SpotGeneration: 1}, CapacitySlot: 1}})
	}
	spot.Record.CapacitySlot = 1
	require.NoError(t, c.VerifyMembers(spot.Record, vs, true))
	k := location.Key(location.KindActor, "one-more")
	c.Members = append(c.Members, CommitMember{Key: k, OwnerGeneration: 4, ObjectGeneration: 1})
	vs = append(vs, location.Versioned{Key: k, Version: 9, Record: &location.Record{Owner: srcOwner, AuthorityOwnerGeneration: 4, ObjectGeneration: 1,
		Membership: &messages.Membership{SpotId: "s1", SpotGeneration: 1}}})
	require.NoError(t, c.VerifyMembers(spot.Record, vs, false), "unbounded: fewer ops")
	require.ErrorIs(t, c.VerifyMembers(spot.Record, vs, true), roamerr.ErrCapacityExceeded)
}
