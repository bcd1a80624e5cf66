package handoff

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

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
