package handoff

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Commit is one attempt of the target's owner commit (docs/PROTOCOL.md
// §5.11) as data: which records it reads, the transaction it writes and
// how it judges what the store answers. The driver reads what a CommitTxn
// names, executes its ops on the Location Store and feeds the answer to
// Answer; every choice between outcomes is made here.
type Commit struct {
	ID  Identity
	Key location.AuthorityKey
	// Owner is this node as an owner record names it.
	Owner              *messages.Owner
	NewOwnerGeneration uint64
	ObjectGeneration   uint64
	// Session is the binding the move carried; without one the record's
	// binding is dropped (the Session owner let it go at the seal).
	Session *messages.SessionBinding
	// SettleOnly: the restore deadline passed while an earlier CAS's
	// outcome was unknown. No new owner CAS is made: a record still at
	// the source's fence is fenced out (FenceOut), and then
	// StoreNotCommitted. A read alone would not do: the earlier CAS may
	// still be on its way and apply after the read, naming a target that
	// has removed itself; after the fence-out it fails on the version.
	SettleOnly      bool
	RestoreDeadline time.Time
	// Join is the User Spot incarnation a cross-node Join makes the Actor
	// a member of in the same transaction (PROTOCOL.md §7.10), or nil.
	Join *messages.Membership
	// EntrySpotID is this node's Entry Spot; IsEntrySpot tells an Entry
	// Spot's ID from a User Spot's.
	EntrySpotID string
	IsEntrySpot func(spotID string) bool
	// SourceNodeRid and SourceNodeGeneration name the move's source: the
	// fence of every SpotWide member.
	SourceNodeRid        string
	SourceNodeGeneration uint64
	// Members are the other participants of a SpotWide move, in
	// participant order (participant i+2); their owners change in the
	// same transaction (PROTOCOL.md §5.15).
	Members []CommitMember
	// Slots are the capacity slots of this node (Node, under Lease) taken
	// ahead of the commit, one per participant in participant order
	// (PROTOCOL.md §7.12); none on a node without capacity slots.
	Slots []uint32
	Node  location.NodeKey
	Lease location.LeaseID
}

// CommitMember is a SpotWide member as its owner change needs it.
type CommitMember struct {
	Key                location.AuthorityKey
	OwnerGeneration    uint64 // the member's fence
	NewOwnerGeneration uint64
	ObjectGeneration   uint64
	Session            *messages.SessionBinding
}

// Committed is what a commit of this move wrote that the incarnation
// keeps: whether it carried the Join, and the User Spot membership its
// record names (nil: none).
type Committed struct {
	Joined bool
	Member *messages.Membership
}

// Deadline bounds the attempt's store calls: the restore deadline, or
// when settling (that deadline has passed) a restore timeout from now.
func (c *Commit) Deadline(now time.Time, restoreTimeout time.Duration) time.Time {
	if c.SettleOnly {
		return now.Add(restoreTimeout)
	}
	return c.RestoreDeadline
}

// ReusesVerified reports whether the attempt may write at the version of
// the record VerifySource read instead of reading again: while the source
// stays sealed nothing else writes it, so a CAS at that version usually
// applies, and a conflict carries the current record. Settling reads: it
// must see what an earlier CAS may have written.
func (c *Commit) ReusesVerified() bool { return !c.SettleOnly }

// ReadMissing is the event of a read that found no record of the object.
func (c *Commit) ReadMissing() Event {
	return StoreStale{Err: fmt.Errorf("%s no longer exists", c.Key)}
}

// Judge compares the object's record, as read, with the move
// (Identity.JudgeCommit): committed by an earlier attempt whose answer was
// lost (with what that commit wrote), stale, or nil to go on.
func (c *Commit) Judge(v location.Versioned) (Event, Committed) {
	ev := c.ID.JudgeCommit(ViewOf(v), c.Owner.GetNodeRid(), c.NewOwnerGeneration, c.ObjectGeneration)
	if _, ok := ev.(StoreCommitted); ok {
		// The record says whether that commit carried the Join.
		return ev, Committed{Joined: c.Join != nil && SameMembership(v.Record.GetMembership(), c.Join), Member: c.userSpotOf(v.Record)}
	}
	return ev, Committed{}
}

// Read judges the object's record as the attempt read it: Judge, and
// unless settling, Identity.JudgeOwnerChange (never an owner over a
// Closing record). nil: go on with FenceOut when settling, else Txn.
func (c *Commit) Read(v location.Versioned) (Event, Committed) {
	if ev, got := c.Judge(v); ev != nil || c.SettleOnly {
		return ev, got
	}
	return c.ID.JudgeOwnerChange(ViewOf(v)), Committed{}
}

// FenceOut is the settling attempt's write: the record read, at its
// version, with the move's RelocationId and the owner unchanged.
func (c *Commit) FenceOut(v location.Versioned) location.Op {
	fence := proto.Clone(v.Record).(*location.Record)
	fence.RelocationId = c.ID.RelocationID
	return location.UpdateOp(c.Key, v.Version, fence)
}

// WriteOutcome is a store write's answer as the commit tells them apart.
type WriteOutcome int

const (
	WriteApplied WriteOutcome = iota
	// WriteConflict: not applied; a record was not at the version
	// expected (the answer may carry the current one).
	WriteConflict
	// WriteLeaseEnded: not applied; the writer's lease has ended.
	WriteLeaseEnded
	// WriteUnknown: sent, and it may have applied (an indeterminate
	// answer, or the caller stopped waiting).
	WriteUnknown
	// WriteFailed: not applied, for another reason (the store is
	// unavailable).
	WriteFailed
)

// WriteOutcomeOf classifies a Location Store write's error.
func WriteOutcomeOf(err error) WriteOutcome {
	switch {
	case err == nil:
		return WriteApplied
	case errors.Is(err, location.ErrConflict):
		return WriteConflict
	case errors.Is(err, location.ErrLeaseEnded):
		return WriteLeaseEnded
	case errors.Is(err, location.ErrIndeterminate), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return WriteUnknown
	}
	return WriteFailed
}

// JudgeWrite turns the answer to the target's compare-and-set (its owner
// commit, or the fence-out of its own move when settling) into the
// machine's event: applied when it applied; on a conflict, what the
// current record says (this move committed, a fence-out, another owner),
// else retry with a fresh read; never again under an ended lease (nothing
// was written); retry with the outcome unknown when it was sent and may
// have applied. current is the record a conflict carried (Present false
// when it carried none).
func (id Identity) JudgeWrite(o WriteOutcome, err error, current RecordView, self string, newOwnerGeneration, objectGeneration uint64, applied Event) Event {
	switch o {
	case WriteApplied:
		return applied
	case WriteConflict:
		if current.Present {
			if ev := id.JudgeCommit(current, self, newOwnerGeneration, objectGeneration); ev != nil {
				return ev
			}
		}
		return StoreRetryable{Err: err, Conflict: true}
	case WriteLeaseEnded:
		return StoreStale{Err: err}
	case WriteUnknown:
		return StoreRetryable{Err: err, Unknown: true}
	}
	return StoreRetryable{Err: err}
}

// Answer judges the store's answer err to the attempt's write: applied
// stands for a write that applied, wrote for what it committed. A
// conflict whose current record shows this move committed (an earlier
// attempt's indeterminate write) is a commit too, with what that record
// says.
func (c *Commit) Answer(err error, applied Event, wrote Committed) (Event, Committed) {
	o := WriteOutcomeOf(err)
	var cur location.Versioned
	var conflict *location.ConflictError
	if o == WriteConflict && errors.As(err, &conflict) {
		cur, _ = conflict.CurrentOf(c.Key)
	}
	ev := c.ID.JudgeWrite(o, err, ViewOf(cur), c.Owner.GetNodeRid(), c.NewOwnerGeneration, c.ObjectGeneration, applied)
	if _, ok := ev.(StoreCommitted); !ok {
		return ev, Committed{}
	}
	if o == WriteApplied {
		return ev, wrote
	}
	_, got := c.Judge(cur)
	return ev, got
}

// Txn starts composing the owner-change transaction at the record v
// read, which Judge and JudgeOwnerChange let go on.
func (c *Commit) Txn(v location.Versioned) *CommitTxn {
	x := &CommitTxn{c: c, rec: v}
	switch {
	case c.Join == nil:
		x.stage = readingMembers
	case SameMembership(c.userSpotOf(v.Record), c.Join):
		// Already a member (an earlier Join of this incarnation).
		x.joined = true
		x.stage = readingMembers
	default:
		x.stage = readingJoinSpot
	}
	x.skipEmpty()
	return x
}

// CommitTxn composes one owner-change transaction from the records it
// asks for, stage by stage: the joined User Spot's record, the record of
// the User Spot the Actor leaves, the SpotWide members' records.
type CommitTxn struct {
	c     *Commit
	rec   location.Versioned
	stage commitStage
	// joined: the transaction makes the Actor a member of c.Join;
	// joinOps change the Spots' member counts (only when joined).
	joined  bool
	refused bool
	spot    location.Versioned // the joined Spot's record, while leaving
	joinOps []location.Op
	members []location.Versioned
}

type commitStage int

const (
	readingJoinSpot commitStage = iota
	readingLeftSpot
	readingMembers
	txnComposed
)

// skipEmpty passes the stages with nothing to read.
func (x *CommitTxn) skipEmpty() {
	if x.stage == readingMembers && len(x.c.Members) == 0 {
		x.stage = txnComposed
	}
}

// Needs names the records to read next, in order; none once the
// transaction is txnComposed (Ops).
func (x *CommitTxn) Needs() []location.AuthorityKey {
	switch x.stage {
	case readingJoinSpot:
		return []location.AuthorityKey{location.Key(location.KindUserSpot, x.c.Join.GetSpotId())}
	case readingLeftSpot:
		return []location.AuthorityKey{location.Key(location.KindUserSpot, x.c.userSpotOf(x.rec.Record).GetSpotId())}
	case readingMembers:
		return x.c.MemberKeys()
	}
	return nil
}

// ReadFailed is the attempt's event when reading what Needs named failed
// (other than a missing record, which Read takes as absent).
func (x *CommitTxn) ReadFailed(err error) Event {
	if x.stage == readingLeftSpot {
		return StoreRetryable{Err: roamerr.Keep(roamerr.ErrUnavailable, "read "+x.Needs()[0].String(), err)}
	}
	return StoreRetryable{Err: err}
}

// Read takes the records Needs named, in its order (a missing one as a
// zero Versioned). A non-nil event ends the attempt without a write.
func (x *CommitTxn) Read(vs []location.Versioned) Event {
	c := x.c
	switch x.stage {
	case readingJoinSpot:
		r := vs[0].Record
		if !vs[0].Present() || r.GetObjectGeneration() != c.Join.GetSpotGeneration() ||
			r.GetState() != messages.LifecycleState_LIFECYCLE_STATE_READY || r.GetOwner().GetNodeRid() != c.Owner.GetNodeRid() {
			// The Spot no longer takes the Actor (closed, moved or
			// recreated): the move commits without the Join.
			x.refused = true
			x.stage = readingMembers
			break
		}
		x.spot = vs[0]
		x.stage = readingMembers
		if c.userSpotOf(x.rec.Record) != nil {
			x.stage = readingLeftSpot
			return nil
		}
		x.join(nil)
	case readingLeftSpot:
		var leave []location.Op
		ms, r := c.userSpotOf(x.rec.Record), vs[0].Record
		// An incarnation gone (released with its members, or created
		// anew) has no count to lower.
		if vs[0].Present() && r.GetObjectGeneration() == ms.GetSpotGeneration() && r.GetMemberCount() > 0 {
			next := proto.Clone(r).(*location.Record)
			next.MemberCount--
			leave = []location.Op{location.UpdateOp(vs[0].Key, vs[0].Version, next)}
		}
		x.join(leave)
		x.stage = readingMembers
	case readingMembers:
		for i, m := range c.Members {
			if err := c.memberAtFence(m, vs[i]); err != nil {
				// Nothing of the move commits; its source, which still
				// holds everything, serves again after the fence-out.
				return StoreStale{Err: err}
			}
		}
		x.members = vs
		x.stage = txnComposed
	}
	x.skipEmpty()
	return nil
}

// join admits the Join: the left Spot's count one less (leave), the
// joined Spot's one more.
func (x *CommitTxn) join(leave []location.Op) {
	next := proto.Clone(x.spot.Record).(*location.Record)
	next.MemberCount++
	x.joined = true
	x.joinOps = append(leave, location.UpdateOp(location.Key(location.KindUserSpot, x.c.Join.GetSpotId()), x.spot.Version, next))
}

// JoinRefused reports whether the joined Spot no longer takes the Actor
// (the move commits without the Join; worth a warning).
func (x *CommitTxn) JoinRefused() bool { return x.refused }

// Ops is the txnComposed transaction — the object's owner change at the
// version read first — and what it commits if it applies. A transaction of
// one op is the owner CAS alone.
func (x *CommitTxn) Ops() ([]location.Op, Committed) {
	c := x.c
	next := c.ownerChange(x.rec.Record, c.NewOwnerGeneration, c.Session)
	// The slot taken ahead turns active, the source's is freed, in the
	// commit itself (PROTOCOL.md §7.12).
	ops := append([]location.Op{location.UpdateOp(c.Key, x.rec.Version, next)}, c.slotOps(0, x.rec.Record, next)...)
	ops = append(ops, x.joinOps...)
	switch {
	case x.joined:
		next.Membership = &messages.Membership{SpotId: c.Join.GetSpotId(), SpotGeneration: c.Join.GetSpotGeneration()}
	case c.Key.Kind == location.KindActor && c.IsEntrySpot(next.GetMembership().GetSpotId()):
		// An Entry Spot Actor joins the target's Entry Spot; a User
		// Spot's member keeps its membership (PROTOCOL.md §5.11).
		next.Membership = &messages.Membership{SpotId: c.EntrySpotID, SpotGeneration: 1}
	}
	for i, m := range c.Members {
		v := x.members[i]
		mnext := c.ownerChange(v.Record, m.NewOwnerGeneration, m.Session)
		ops = append(append(ops, location.UpdateOp(m.Key, v.Version, mnext)), c.slotOps(i+1, v.Record, mnext)...)
	}
	return ops, Committed{Joined: x.joined, Member: c.userSpotOf(next)}
}

// ownerChange is rec naming this node as its owner at ownerGeneration,
// written by this move.
func (c *Commit) ownerChange(rec *location.Record, ownerGeneration uint64, session *messages.SessionBinding) *location.Record {
	next := proto.Clone(rec).(*location.Record)
	next.Owner = c.Owner
	next.AuthorityOwnerGeneration = ownerGeneration
	next.RelocationId = c.ID.RelocationID
	if session == nil {
		// The source dropped the binding, its Session being gone.
		next.SessionId, next.SessionOwnerAddress = "", ""
	}
	return next
}

// slotOps are participant i's capacity slot ops (0: the moving object):
// its slot here, taken ahead, turns active and next names it; the slot
// its source holds (named by prev) is freed.
func (c *Commit) slotOps(i int, prev, next *location.Record) []location.Op {
	ops := FreeRecordSlotOps(prev)
	WithSlot(next, c.Slots, i)
	if i < len(c.Slots) {
		key := c.Key
		if i > 0 {
			key = c.Members[i-1].Key
		}
		ops = append(ops, location.SetSlotOp(c.Node, c.Lease, c.Slots[i], key, false))
	}
	return ops
}

// MemberKeys are the SpotWide members' keys, in participant order.
func (c *Commit) MemberKeys() []location.AuthorityKey {
	keys := make([]location.AuthorityKey, len(c.Members))
	for i, m := range c.Members {
		keys[i] = m.Key
	}
	return keys
}

// VerifyMembers checks, for VerifySource, the members' records (vs, in
// participant order) against the move, and that the commit's transaction
// fits in the store's (PROTOCOL.md §5.15): the lease check, and per
// participant its owner change, plus on a node bounded by capacity slots
// the slot's activation, plus the freeing of the slot its source holds.
// spot is the Spot's own record.
func (c *Commit) VerifyMembers(spot *location.Record, vs []location.Versioned, bounded bool) error {
	perParticipant := func(rec *location.Record) int {
		n := 1
		if bounded {
			n++
		}
		if _, ok := RecordSlot(rec); ok {
			n++
		}
		return n
	}
	ops := 1 + perParticipant(spot)
	for i, m := range c.Members {
		if err := c.memberAtFence(m, vs[i]); err != nil {
			return err
		}
		ops += perParticipant(vs[i].Record)
	}
	if ops > location.MaxApplyOps {
		return fmt.Errorf("%w: a SpotWide move of %d members into node %s takes %d store operations in its commit, at most %d fit in one transaction",
			roamerr.ErrCapacityExceeded, len(c.Members), c.Owner.GetNodeRid(), ops, location.MaxApplyOps)
	}
	return nil
}

// memberAtFence checks a member's record against the move: owned by the
// source at the member's fence, at its generation, still a member of the
// Spot incarnation that moves.
func (c *Commit) memberAtFence(m CommitMember, v location.Versioned) error {
	r := v.Record
	switch {
	case !v.Present():
		return fmt.Errorf("%w: member %s has no record", roamerr.ErrStale, m.Key)
	case r.GetOwner().GetNodeRid() != c.SourceNodeRid || r.GetOwner().GetNodeGeneration() != c.SourceNodeGeneration ||
		r.GetAuthorityOwnerGeneration() != m.OwnerGeneration || r.GetObjectGeneration() != m.ObjectGeneration:
		return fmt.Errorf("%w: member %s is not at the move's fence", roamerr.ErrStale, m.Key)
	case r.GetMembership().GetSpotId() != c.Key.ID || r.GetMembership().GetSpotGeneration() != c.ObjectGeneration:
		return fmt.Errorf("%w: %s is no longer a member of User Spot %q", roamerr.ErrStale, m.Key, c.Key.ID)
	}
	return nil
}

// userSpotOf is the User Spot membership rec names, or nil (none, or an
// Entry Spot's).
func (c *Commit) userSpotOf(rec *location.Record) *messages.Membership {
	return UserSpotOf(rec, c.IsEntrySpot)
}

// ViewOf is what the machines judge of a record read from the store.
func ViewOf(v location.Versioned) RecordView {
	if !v.Present() {
		return RecordView{}
	}
	r := v.Record
	return RecordView{
		Present: true, Version: uint64(v.Version),
		OwnerNodeRid: r.GetOwner().GetNodeRid(), OwnerNodeGeneration: r.GetOwner().GetNodeGeneration(),
		OwnerGeneration: r.GetAuthorityOwnerGeneration(), ObjectGeneration: r.GetObjectGeneration(), RelocationID: r.GetRelocationId(),
		State: r.GetState(),
	}
}

// RecordSlot is the capacity slot rec's owner holds for it, if any.
func RecordSlot(rec *location.Record) (uint32, bool) {
	if n := rec.GetCapacitySlot(); n > 0 {
		return n - 1, true
	}
	return 0, false
}

// FreeRecordSlotOps are the ops that free the slot rec's owner holds for
// it: for the transaction that takes the object off that node.
func FreeRecordSlotOps(rec *location.Record) []location.Op {
	slot, ok := RecordSlot(rec)
	if !ok {
		return nil
	}
	o := rec.GetOwner()
	return []location.Op{location.FreeSlotOp(location.NodeKey{Mesh: o.GetMesh(), NodeRid: o.GetNodeRid()}, slot)}
}

// WithSlot is rec naming slots[i] as its owner's capacity slot (none
// past the end of slots).
func WithSlot(rec *location.Record, slots []uint32, i int) *location.Record {
	if i < len(slots) {
		rec.CapacitySlot = slots[i] + 1
	} else {
		rec.CapacitySlot = 0
	}
	return rec
}
