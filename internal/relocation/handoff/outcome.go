package handoff

import (
	"errors"
	"fmt"
	"time"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// CommitShown judges a record read after the cutover for the answer of
// the caller who asked for the move (relocationID of key, into target;
// self is the source): the target's commit (done, nil), the move fenced
// out or the object owned elsewhere (done, an error), or not yet (false).
func CommitShown(relocationID uint64, key location.AuthorityKey, target, self string, v RecordView) (bool, error) {
	switch {
	case v.RelocationID == relocationID && v.OwnerNodeRid == target:
		return true, nil
	case v.RelocationID == relocationID && v.OwnerNodeRid == self:
		return true, fmt.Errorf("%w: the target did not commit relocation %d by its restore deadline; the move was fenced out and %s serves on this node", roamerr.ErrUnavailable, relocationID, key)
	case v.Present && v.OwnerNodeRid != self:
		return true, fmt.Errorf("%w: %s is owned by %s, not the target", roamerr.ErrStale, key, v.OwnerNodeRid)
	}
	return false, nil
}

// CommitPatience is how long the caller who asked for a move waits to
// learn which way it went: the fence-out of a target that never commits
// is written only after the restore deadline plus a cutover wait (and one
// more read, within restoreTimeout), so it waits well past that.
func (c Config) CommitPatience(restoreDeadline time.Time, restoreTimeout time.Duration) time.Time {
	return restoreDeadline.Add(c.CutoverWaitTimeout + restoreTimeout)
}

// BusyAtSeal is an idle-only move's check at the seal, between turns: a
// message queued (queued, the saved-work prefix) or a timer due within
// window (due names it) makes it busy; the move then unseals with
// everything in place and nothing captured. A move that is not idle-only
// is never busy, and asks due nothing.
func BusyAtSeal(key location.AuthorityKey, idleOnly bool, queued int, window time.Duration, due func(window time.Duration) (string, bool)) error {
	switch {
	case !idleOnly:
		return nil
	case queued > 0:
		return BusyError(key, fmt.Sprintf("%d messages queued at the seal", queued))
	}
	if name, ok := due(window); ok {
		return BusyError(key, fmt.Sprintf("timer %q is due within %v", name, window))
	}
	return nil
}

// BusyError is an idle-only move's refusal of key, for why.
func BusyError(key location.AuthorityKey, why string) error {
	return fmt.Errorf("%w: %w: %s is not idle (%s); nothing moved", roamerr.ErrUnavailable, roamerr.ErrBusy, key, why)
}

// Verify pacing: the first pause before VerifySource tries again, and the
// most it grows to.
const (
	FirstVerifyWait = 5 * time.Millisecond
	MaxVerifyWait   = 500 * time.Millisecond
)

// VerifyAgain decides after one try of VerifySource ended with err
// (nil: verified): whether to try again, after how long (prev: the last
// pause, 0 for none), or answer SourceVerified{Err: err}. Only an answer
// that says nothing of the source is tried again — the source's node not
// reachable (peer: the membership check failed), the store unavailable or
// its answer unknown; the restore deadline ends the tries.
func VerifyAgain(err error, peer bool, prev time.Duration) (again bool, after time.Duration) {
	switch {
	case err == nil:
		return false, 0
	case peer && !errors.Is(err, roamerr.ErrUnavailable):
		return false, 0
	case !peer && !errors.Is(err, location.ErrUnavailable) && !errors.Is(err, location.ErrIndeterminate):
		return false, 0
	case prev <= 0:
		return true, FirstVerifyWait
	}
	return true, min(2*prev, MaxVerifyWait)
}

// VerifyPause is the pause of wait (VerifyAgain's) that VerifySource
// takes at now before its next try, cut at the restore deadline: a pause
// that reaches the deadline ends the tries (expired), and the last try's
// error is the answer, since no try could now verify in time.
func VerifyPause(now, deadline time.Time, wait time.Duration) (pause time.Duration, expired bool) {
	if now.Add(wait).Before(deadline) {
		return wait, false
	}
	return max(deadline.Sub(now), 0), true
}
