// Package spawn is the pure policy of an object's birth and end on its
// owner (docs/PROTOCOL.md §2.3, §7.9, §7.10, §7.12): the record a spawn
// creates and the transaction that writes it, how the store's answer is
// judged (an unknown outcome is settled by a consistent read, and a
// record that lands after its spawn gave up is removed), which Close or
// DeleteActor an incarnation admits, and how a deleted Actor's record
// delete is judged and tried again. The driver starts and stops
// incarnations, reads and writes the store and sleeps the pauses named
// here; nothing here has a goroutine, a clock or a network.
package spawn

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Spec is one spawn of key as its record needs it.
type Spec struct {
	Key        location.AuthorityKey
	StableType string
	// Generation is the new incarnation's ObjectGeneration, never one an
	// earlier incarnation of the ID had (PROTOCOL.md §2.3).
	Generation uint64
	// Owner is this node as an owner record names it.
	Owner *messages.Owner
	// PreservesState: the kind keeps state across moves (the record says
	// so to whoever recovers it).
	PreservesState bool
	// Session is the client Session the Actor is bound to, or nil.
	Session *messages.SessionBinding
	// Member is the User Spot incarnation the Actor becomes a member of,
	// and SpotAt that Spot's record as read; nil: none.
	Member *messages.Membership
	SpotAt location.Versioned
	// EntrySpotID is this node's Entry Spot, which an Actor spawned
	// without a User Spot is a member of.
	EntrySpotID string
}

// Admit refuses a spawn of key of a stable type not registered here
// (registered false: NotFound) or of a key that is not valid
// (InvalidOperation), before anything is written.
func Admit(key location.AuthorityKey, stableType string, registered bool) error {
	if !registered {
		return fmt.Errorf("%w: stable type %q is not registered", roamerr.ErrNotFound, stableType)
	}
	if err := key.Validate(); err != nil {
		return fmt.Errorf("%w: %w", roamerr.ErrInvalidOperation, err)
	}
	return nil
}

// Create is the record the spawn writes and the ops of its transaction:
// the record, created only where there is none, Ready and owned here at
// owner generation 1. A member's Spot counts one more in the same
// transaction at the version the spawn read, so a Close or
// re-reservation that read the count before conflicts and reads again
// (PROTOCOL.md §7.9, §7.10); any other Actor joins this node's Entry
// Spot; an Instance Spot is of the instance kind. The capacity slot's
// take is the driver's (it picks the index): it names the slot in rec,
// which the create op holds.
func (s Spec) Create() (rec *location.Record, ops []location.Op) {
	rec = &location.Record{
		ObjectGeneration:         s.Generation,
		AuthorityOwnerGeneration: 1,
		State:                    messages.LifecycleState_LIFECYCLE_STATE_READY,
		StableType:               s.StableType,
		Owner:                    s.Owner,
		PreservesState:           s.PreservesState,
		SessionId:                s.Session.GetSessionId(),
		SessionOwnerAddress:      s.Session.GetOwnerAddress(),
	}
	ops = []location.Op{location.CreateOp(s.Key, rec)}
	switch {
	case s.Member != nil:
		rec.Membership = s.Member
		spot := proto.Clone(s.SpotAt.Record).(*location.Record)
		spot.MemberCount++
		ops = append(ops, location.UpdateOp(s.SpotAt.Key, s.SpotAt.Version, spot))
	case s.Key.Kind == location.KindActor:
		rec.Membership = &messages.Membership{SpotId: s.EntrySpotID, SpotGeneration: 1}
	default:
		rec.SpotKind = messages.SpotKind_SPOT_KIND_INSTANCE
	}
	return rec, ops
}

// Step is what a spawn does after its transaction's answer.
type Step int

const (
	// Done: the record is the spawn's; its incarnation starts.
	Done Step = iota
	// ReadBack: the answer was indeterminate; a record that landed must
	// be served, so read what the store holds (Read).
	ReadBack
	// Fail: nothing of the spawn landed; the error says why.
	Fail
)

// Wrote judges the answer err to the spawn's transaction.
func (s Spec) Wrote(err error) (Step, error) {
	switch {
	case err == nil:
		return Done, nil
	case errors.Is(err, location.ErrIndeterminate):
		return ReadBack, nil
	}
	return Fail, s.Failure(err)
}

// Failure is the error of a spawn whose record the store does not hold
// (err: why): CapacityExceeded as the slot take said; Stale when the
// member's Spot changed since it was read (the conflict carries it at
// another version); AlreadyExists on any other conflict (the ID is in
// use); Unavailable, keeping its cause, when the store failed.
func (s Spec) Failure(err error) error {
	if errors.Is(err, roamerr.ErrCapacityExceeded) {
		return err
	}
	var ce *location.ConflictError
	if errors.As(err, &ce) && s.Member != nil {
		if cur, ok := ce.CurrentOf(s.SpotAt.Key); ok && cur.Version != s.SpotAt.Version {
			return roamerr.Wrap(roamerr.ErrStale, fmt.Sprintf("User Spot %q changed before %s joined", s.SpotAt.Key.ID, s.Key), err)
		}
	}
	if errors.Is(err, location.ErrConflict) {
		return roamerr.Wrap(roamerr.ErrAlreadyExists, s.Key.String(), err)
	}
	return roamerr.Keep(roamerr.ErrUnavailable, "spawn "+s.Key.String(), err)
}

// Look is what a read after an indeterminate spawn found.
type Look int

const (
	// Landed: the store holds exactly the spawn's record.
	Landed Look = iota
	// Absent: not now. The write may still be on its way and land after
	// the read: the spawn gives up and watches for it (Watch).
	Absent
	// Taken: another record holds the key (Exists).
	Taken
	// Unknown: the read failed; read again after a store pause.
	Unknown
)

// Read judges the record read as v (err: the read's error) against rec,
// the record the spawn wrote.
func Read(v location.Versioned, err error, rec *location.Record) Look {
	switch {
	case errors.Is(err, location.ErrNotFound):
		return Absent
	case err != nil:
		return Unknown
	case proto.Equal(v.Record, rec):
		return Landed
	}
	return Taken
}

// Exists is the answer of a spawn whose read back found another record:
// the spawn's write conflicted with it (Failure makes it AlreadyExists).
func (s Spec) Exists() error {
	return fmt.Errorf("%w: %s exists", location.ErrConflict, s.Key)
}

// WatchFor is how long a spawn given up after an indeterminate write
// watches for its record: longer than a store request can stay on its
// way (the store's own request timeouts are seconds).
const WatchFor = time.Minute

// Watch paces the watch for a given-up spawn's record: should it land
// late, nothing serves it, and it is deleted again.
type Watch struct {
	until time.Time
	pause time.Duration
}

// NewWatch starts a watch at now.
func NewWatch(now time.Time) *Watch { return &Watch{until: now.Add(WatchFor)} }

// Next is the pause before the next read, growing from 50 ms to 5 s;
// false once the watch is over.
func (w *Watch) Next(now time.Time) (time.Duration, bool) {
	if !now.Before(w.until) {
		return 0, false
	}
	if w.pause == 0 {
		w.pause = 50 * time.Millisecond
	} else {
		w.pause = min(2*w.pause, 5*time.Second)
	}
	return w.pause, true
}

// Late is what the watch does with a read.
type Late int

const (
	// Watching: nothing there, or the store could not say: read again.
	Watching Late = iota
	// Leave: another spawn's record, or one changed since: not this
	// spawn's to remove; the watch ends.
	Leave
	// Remove: the given-up spawn's record landed: delete it (with its
	// place in a User Spot's count and its slot), loudly.
	Remove
)

// LateRead judges a read of the watch (v, err) against rec, the given-up
// spawn's record.
func LateRead(v location.Versioned, err error, rec *location.Record) Late {
	switch {
	case err != nil:
		return Watching
	case !proto.Equal(v.Record, rec):
		return Leave
	}
	return Remove
}
