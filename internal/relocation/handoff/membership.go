package handoff

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/internal/activation"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// The Actor lifecycle's membership decisions (docs/PROTOCOL.md §7.10): an
// Actor is a member of its node's Entry Spot or of a User Spot
// incarnation, whose record counts its members (member_count) in the same
// transaction as every membership change. The driver reads the records
// and runs what these return.

// UserSpotOf is the User Spot membership rec names, or nil (none, or an
// Entry Spot's: isEntry tells an Entry Spot's ID from a User Spot's).
func UserSpotOf(rec *location.Record, isEntry func(spotID string) bool) *messages.Membership {
	ms := rec.GetMembership()
	if ms.GetSpotId() == "" || isEntry(ms.GetSpotId()) {
		return nil
	}
	return ms
}

// SameMembership reports whether a and b name the same Spot incarnation.
func SameMembership(a, b *messages.Membership) bool {
	return a.GetSpotId() == b.GetSpotId() && a.GetSpotGeneration() == b.GetSpotGeneration()
}

// LeaveOps are the ops that take one member off the User Spot incarnation
// ms (a member's UserSpotOf; nil: none), whose record was read as spot
// (not present: gone): its count, one less, at the version read. None
// when that incarnation is gone (a Spot released with its members, or
// created anew) or counts nobody.
func LeaveOps(ms *messages.Membership, spot location.Versioned) []location.Op {
	if ms == nil || !spot.Present() {
		return nil
	}
	if spot.Record.GetObjectGeneration() != ms.GetSpotGeneration() || spot.Record.GetMemberCount() == 0 {
		return nil
	}
	next := proto.Clone(spot.Record).(*location.Record)
	next.MemberCount--
	return []location.Op{location.UpdateOp(location.Key(location.KindUserSpot, ms.GetSpotId()), spot.Version, next)}
}

// MaxMembershipTries bounds the retries of a membership change that lost
// a race with another change of the same records.
const MaxMembershipTries = 16

// MembershipRetry decides after try (from 0) of a membership write named
// what failed with err: read again and retry after pause, or fail with
// the error returned. Only a conflict is retried, until the last try,
// which ends Unavailable (the caller may try again later); any other
// failure ends Unavailable at once, keeping its cause. The pause is
// RacePause's, drawn from intN.
func MembershipRetry(what string, try int, err error, intN func(n int) int) (pause time.Duration, fail error) {
	if !errors.Is(err, location.ErrConflict) {
		return 0, roamerr.Keep(roamerr.ErrUnavailable, what, err)
	}
	if try >= MaxMembershipTries {
		return 0, fmt.Errorf("%w: %s: lost %d races with other changes of the same records: %v", roamerr.ErrUnavailable, what, try+1, err)
	}
	return RacePause(try, intN), nil
}

// RacePause is the pause before try (from 0) again of a write that lost a
// race: short, growing and jittered (intN(n) draws from [0, n), as
// math/rand's IntN), so that racing writers spread out.
func RacePause(try int, intN func(n int) int) time.Duration {
	return time.Duration(1+intN(1<<min(try, 6))) * time.Millisecond
}

// StorePause is the pause before try (from 1) again of a store call that
// failed: 50 ms more each time, at most a second.
func StorePause(try int) time.Duration {
	return min(time.Second, time.Duration(try)*50*time.Millisecond)
}

// JoinTarget judges the record of the User Spot a Join names, read as sv
// (err: the read's error): the Spot must be Ready at the generation join
// names. Stale when it is gone or changed, Unavailable when the store
// could not say.
func JoinTarget(join *messages.Membership, sv location.Versioned, err error) error {
	spotKey := location.Key(location.KindUserSpot, join.GetSpotId())
	switch {
	case errors.Is(err, location.ErrNotFound):
		return fmt.Errorf("%w: User Spot %q is gone", roamerr.ErrStale, join.GetSpotId())
	case err != nil:
		return roamerr.Keep(roamerr.ErrUnavailable, "read "+spotKey.String(), err)
	case sv.Record.GetState() != messages.LifecycleState_LIFECYCLE_STATE_READY || sv.Record.GetObjectGeneration() != join.GetSpotGeneration():
		return fmt.Errorf("%w: User Spot %q is not Ready at generation %d", roamerr.ErrStale, join.GetSpotId(), join.GetSpotGeneration())
	}
	return nil
}

// JoinOps are the ops of a Join on the Spot's own node: the Actor key,
// read as v, leaves what leave takes it off (LeaveOps) and becomes a
// member of join, whose Spot's record, read as sv, counts one more; all
// at the versions read. next is the Actor's record as written.
func JoinOps(key location.AuthorityKey, v location.Versioned, join *messages.Membership, sv location.Versioned, leave []location.Op) (ops []location.Op, next *location.Record) {
	next = proto.Clone(v.Record).(*location.Record)
	next.Membership = &messages.Membership{SpotId: join.GetSpotId(), SpotGeneration: join.GetSpotGeneration()}
	spot := proto.Clone(sv.Record).(*location.Record)
	spot.MemberCount++
	ops = append(append(ops, leave...), location.UpdateOp(key, v.Version, next),
		location.UpdateOp(location.Key(location.KindUserSpot, join.GetSpotId()), sv.Version, spot))
	return ops, next
}

// Reread is what a member's delete that lost a race does after reading
// the Actor's record again.
type Reread int

const (
	// DeleteAgain: the record is still this incarnation's, at a new
	// version (its Spot's count or the record moved): delete it there.
	DeleteAgain Reread = iota
	// DeleteGone: no record, or another incarnation's (the ID spawned
	// again): nothing of this one is left to delete.
	DeleteGone
	// DeleteNotOurs: another owner holds it now.
	DeleteNotOurs
)

// DeleteReread judges the Actor's record read again as cur (found: there
// is one) after the delete of v by owner lost a race.
func DeleteReread(v, cur location.Versioned, found bool, owner *messages.Owner) Reread {
	switch {
	case !found || cur.Record.GetObjectGeneration() != v.Record.GetObjectGeneration():
		return DeleteGone
	case !activation.SameOwner(cur.Record.GetOwner(), owner):
		return DeleteNotOurs
	}
	return DeleteAgain
}

// DeletePause is the pause before try (from 0) again of a member's delete
// that failed with err: a lost race's (RacePause, drawn from intN), or a
// failed store call's (StorePause; store is then true: worth a warning).
func DeletePause(try int, err error, intN func(n int) int) (pause time.Duration, store bool) {
	if errors.Is(err, location.ErrConflict) {
		return RacePause(try, intN), false
	}
	return StorePause(try + 1), true
}

// ActorKey refuses a key that names no Actor: only an Actor is deleted,
// joins or leaves a User Spot.
func ActorKey(key location.AuthorityKey) error {
	if key.Kind != location.KindActor {
		return fmt.Errorf("%w: %s is not an Actor", roamerr.ErrInvalidOperation, key)
	}
	if err := key.Validate(); err != nil {
		return fmt.Errorf("%w: %w", roamerr.ErrInvalidOperation, err)
	}
	return nil
}

// RecordRead judges the answer err to a read of key's record (an Actor's,
// or the User Spot's it is a member of): found false when there is none, Unavailable (keeping its cause) when
// the store could not say.
func RecordRead(key location.AuthorityKey, err error) (found bool, _ error) {
	switch {
	case errors.Is(err, location.ErrNotFound):
		return false, nil
	case err != nil:
		return false, roamerr.Keep(roamerr.ErrUnavailable, "read "+key.String(), err)
	}
	return true, nil
}

// OwnedHere refuses a membership change of the Actor key, read as v
// (found: it has a record), unless owner (this node's lifecycle) owns it:
// only its owner's serving incarnation changes its membership.
func OwnedHere(key location.AuthorityKey, v location.Versioned, found bool, owner *messages.Owner) error {
	switch {
	case !found:
		return fmt.Errorf("%w: %s", roamerr.ErrNotFound, key)
	case !activation.SameOwner(v.Record.GetOwner(), owner):
		return fmt.Errorf("%w: %s is not owned by this node", roamerr.ErrNotFound, key)
	}
	return nil
}

// Member refuses a Leave of the Actor key, read as v, that is no User
// Spot's member (isEntry tells an Entry Spot's ID from a User Spot's).
func Member(key location.AuthorityKey, v location.Versioned, isEntry func(spotID string) bool) error {
	if UserSpotOf(v.Record, isEntry) == nil {
		return fmt.Errorf("%w: %s is no User Spot's member", roamerr.ErrInvalidOperation, key)
	}
	return nil
}

// LeaveTxn is the transaction of a Leave: the Actor key, read as v, is
// taken off its User Spot's count by leave (LeaveOps) and becomes a
// member of this node's Entry Spot entrySpotID, at the version read.
func LeaveTxn(key location.AuthorityKey, v location.Versioned, entrySpotID string, leave []location.Op) []location.Op {
	next := proto.Clone(v.Record).(*location.Record)
	next.Membership = &messages.Membership{SpotId: entrySpotID, SpotGeneration: 1}
	return append(leave, location.UpdateOp(key, v.Version, next))
}
