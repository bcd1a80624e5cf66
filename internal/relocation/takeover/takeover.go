// Package takeover is the pure policy of a node taking over an object
// whose owner ended (docs/FAULTS.md, "Checkpoints and recovery"): which
// records may be taken over and the record the takeover writes, how the
// store's answer to that write is judged (an unknown outcome is settled by
// consistent reads, never by a timeout), and the pause before a failed
// checkpoint restore is tried again. The driver stages the incarnation,
// reads and writes the store, and sleeps the pauses named here.
package takeover

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

// Kind is what the recovering node knows of the record's stable type.
type Kind struct {
	Registered bool
	// PreservesState: the kind's policy keeps state across moves and
	// recoveries (the record says so to whoever reads it).
	PreservesState bool
}

// Claim is the record a takeover of key, read as rec, by owner (this
// node's lifecycle, whose Entry Spot is entrySpotID) writes: the same
// incarnation (its ObjectGeneration stays, so a User Spot's members stay
// members and its count stays exact) under the next owner generation, no
// move under way. An Actor that was a member of the ended owner's Entry
// Spot (isEntry) joins this node's: the ended one went with its owner.
// Only a Ready Actor or User Spot of a kind registered here is taken over.
func Claim(key location.AuthorityKey, rec *location.Record, k Kind, owner *messages.Owner, entrySpotID string,
	isEntry func(spotID string) bool) (*location.Record, error) {
	switch {
	case key.Kind != location.KindActor && key.Kind != location.KindUserSpot:
		return nil, fmt.Errorf("%w: %s: only Actors and User Spots are taken over here", roamerr.ErrInvalidOperation, key)
	case !k.Registered:
		return nil, fmt.Errorf("%w: stable type %q is not registered here", roamerr.ErrNotFound, rec.GetStableType())
	case rec.GetState() != messages.LifecycleState_LIFECYCLE_STATE_READY:
		return nil, fmt.Errorf("%w: %s is not Ready", roamerr.ErrInvalidOperation, key)
	}
	next := proto.Clone(rec).(*location.Record)
	next.Owner = owner
	next.AuthorityOwnerGeneration = rec.GetAuthorityOwnerGeneration() + 1
	next.RelocationId = 0
	next.PreservesState = k.PreservesState
	if key.Kind == location.KindActor && isEntry(rec.GetMembership().GetSpotId()) {
		next.Membership = &messages.Membership{SpotId: entrySpotID, SpotGeneration: 1}
	}
	return next, nil
}

// Step is what a takeover's write does next.
type Step int

const (
	// Done: the record is the takeover's.
	Done Step = iota
	// ReadBack: read the record to learn whether the write landed.
	ReadBack
	// Again: send the write again (the record is still at the version
	// read, after an unknown outcome: a lost write landing later then
	// conflicts).
	Again
	// Unsettled: whether the write landed cannot be told now; a
	// settlement goes on reading for as long as the lifecycle lasts.
	Unsettled
	// Fail: the takeover failed; nothing of it landed.
	Fail
)

// MaxWrites bounds the writes of one attempt to take over a record whose
// outcome stays unknown while the record is still at the version read.
const MaxWrites = 5

// Write judges the store's answers to the writes of one takeover of key.
type Write struct {
	Key location.AuthorityKey
	// unknown: an earlier write's outcome is unknown (it may land yet), so
	// a later failure proves nothing (a full node may be full of it).
	unknown bool
	writes  int
}

// Wrote judges the answer err to a write of the record (and of a
// capacity slot): done, a read to settle a conflict or an unknown
// outcome, or the failure to return.
func (w *Write) Wrote(err error) (Step, error) {
	w.writes++
	ambiguous := errors.Is(err, location.ErrIndeterminate) || errors.Is(err, location.ErrConflict)
	switch {
	case err == nil:
		return Done, nil
	case w.unknown && !ambiguous:
		return Unsettled, nil
	case errors.Is(err, roamerr.ErrCapacityExceeded):
		return Fail, err
	case !ambiguous:
		return Fail, roamerr.Keep(roamerr.ErrUnavailable, "take over "+w.Key.String(), err)
	}
	return ReadBack, nil
}

// Read judges what a read after a write's answer werr found (Landed's
// verdict): done, write again, unsettled, or lost to another writer.
func (w *Write) Read(landed, again bool, rerr, werr error) (Step, error) {
	switch {
	case landed:
		return Done, nil
	case again && w.writes < MaxWrites:
		w.unknown = true
		return Again, nil
	case again || rerr != nil:
		return Unsettled, nil
	}
	return Fail, roamerr.Wrap(roamerr.ErrConflict, w.Key.String()+" changed while it was being taken over", werr)
}

// Landed judges the record read as cur (rerr: the read's error) after the
// write of next over v failed with werr: landed when the record is next
// (this lifecycle, its owner and object generations), again when it is
// still v after an unknown outcome. Neither, without an error: another
// write won (or the record is gone). An error: the store could not say.
func Landed(cur location.Versioned, rerr error, v location.Versioned, next *location.Record, werr error) (landed, again bool, err error) {
	switch {
	case rerr == nil && activation.SameOwner(cur.Record.GetOwner(), next.GetOwner()) &&
		cur.Record.GetAuthorityOwnerGeneration() == next.GetAuthorityOwnerGeneration() && cur.Record.GetObjectGeneration() == next.GetObjectGeneration():
		return true, false, nil
	case rerr == nil && cur.Version == v.Version && errors.Is(werr, location.ErrIndeterminate):
		return false, true, nil
	case rerr != nil && !errors.Is(rerr, location.ErrNotFound):
		return false, false, rerr
	}
	return false, false, nil
}

// Settle judges one look of a settlement of an unsettled write (Landed's
// verdict after an unknown outcome): done, look again later (the store is
// away), write again, or lost.
func Settle(landed, again bool, rerr error, key location.AuthorityKey) (Step, error) {
	switch {
	case landed:
		return Done, nil
	case rerr != nil:
		return ReadBack, nil
	case !again:
		return Fail, fmt.Errorf("%w: %s changed while it was being taken over", roamerr.ErrConflict, key)
	}
	return Again, nil
}

// RestorePause is the pause before a failed checkpoint restore is tried
// again (try from 1): doubling from a second up to half a minute.
func RestorePause(try int) time.Duration {
	return min(30*time.Second, time.Second<<min(try-1, 5))
}
