package activation

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// Outcome is how a Write ended.
type Outcome int

// Write outcomes.
const (
	// Pending: not decided yet.
	Pending Outcome = iota
	// Applied: the write landed; Result's version is the record's.
	Applied
	// Lost: the write did not land (a conflict, or settling found another
	// record or none); the caller reads the authority again.
	Lost
	// WriteFailed: the store failed, or the outcome stayed unknown until
	// the deadline; Result's error says which.
	WriteFailed
	// CheckpointFound: a reservation checking that no checkpoint is
	// stored (CheckingNoCheckpoint) found one; nothing of it applied.
	CheckpointFound
)

type writeState int

const (
	writeIdle writeState = iota
	writeSent
	writeReading // a settling re-read is out
	writeWaiting // between two settling re-reads
	writeDone
)

// Write is one store write whose outcome is decided (docs/PROTOCOL.md §3.3; an
// indeterminate answer is settled by a consistent read, never assumed): a
// conflict is Lost, an indeterminate answer is followed by consistent
// re-reads every SettleBackoff until one shows the write's own mark
// (Applied), another record or none (Lost), or the deadline passes with
// the outcome unknown (WriteFailed, DeadlineExceeded).
type Write struct {
	effect   Effect
	key      location.AuthorityKey
	verb     string // "commit", "reserve": what a store error names
	mine     func(*location.Record) bool
	backoff  time.Duration
	deadline time.Time
	alone    bool

	state   writeState
	expired bool
	lastErr error
	outcome Outcome
	version location.StoreVersion
	err     error
}

// NewCompareAndSet decides a compare-and-set of rec over key at expected;
// its mark is rec itself. deadline zero means none.
func NewCompareAndSet(cfg Config, key location.AuthorityKey, expected location.StoreVersion, rec *location.Record, deadline time.Time) *Write {
	return &Write{
		effect: CompareAndSet{Key: key, Expected: expected, Record: rec},
		key:    key, verb: "commit",
		mine:    func(got *location.Record) bool { return proto.Equal(got, rec) },
		backoff: cfg.SettleBackoff, deadline: deadline,
	}
}

// NewReserve decides a reservation: rec written at key (created if
// expected is 0) in one transaction with a check that the same ID under
// other is absent. mine recognises the reservation's own mark (its
// operation). deadline zero means none.
func NewReserve(cfg Config, key location.AuthorityKey, expected location.StoreVersion, rec *location.Record, other location.Kind,
	mine func(*location.Record) bool, deadline time.Time) *Write {
	return &Write{
		effect: Reserve{Key: key, Expected: expected, Record: rec, Other: other},
		key:    key, verb: "reserve",
		mine: mine, backoff: cfg.SettleBackoff, deadline: deadline,
	}
}

// Replacing names the record a reservation or a take-over replaces, and
// for a reservation the capacity of the new owner's node when that is
// another node (Reserve.Replaced, Reserve.OwnerCapacity,
// CompareAndSet.Replaced).
func (w *Write) Replacing(replaced *location.Record, ownerCapacity uint32) *Write {
	switch e := w.effect.(type) {
	case Reserve:
		e.Replaced, e.OwnerCapacity = replaced, ownerCapacity
		w.effect = e
	case CompareAndSet:
		e.Replaced = replaced
		w.effect = e
	}
	return w
}

// CheckingNoCheckpoint makes a reservation also check that its key has no
// checkpoint (Reserve.NoCheckpoint).
func (w *Write) CheckingNoCheckpoint() *Write {
	if e, ok := w.effect.(Reserve); ok {
		e.NoCheckpoint = true
		w.effect = e
	}
	return w
}

// Alone makes w a machine of its own: it ends with Finish (its error is
// Result's) and starts its own deadline timer.
func (w *Write) Alone() *Write {
	w.alone = true
	return w
}

// Start returns the write to send.
func (w *Write) Start() []Effect {
	w.state = writeSent
	if w.alone && !w.deadline.IsZero() {
		return []Effect{StartTimer{Timer: TimerDeadline, At: w.deadline}, w.effect}
	}
	return []Effect{w.effect}
}

// Done reports whether the outcome is decided.
func (w *Write) Done() bool { return w.state == writeDone }

// Result is the outcome, the version an Applied write produced, and why a
// write failed.
func (w *Write) Result() (Outcome, location.StoreVersion, error) { return w.outcome, w.version, w.err }

// Step feeds one event; see Write. Events that are not for the write's
// current state change nothing.
func (w *Write) Step(ev Event) []Effect {
	if w.state == writeDone || w.state == writeIdle {
		return nil
	}
	switch ev := ev.(type) {
	case WriteAnswered:
		if w.state != writeSent {
			return nil
		}
		switch {
		case ev.Err == nil:
			return w.end(Applied, ev.Version, nil)
		case ev.CheckpointStored:
			return w.end(CheckpointFound, 0, nil)
		case errors.Is(ev.Err, location.ErrConflict):
			return w.end(Lost, 0, nil)
		case errors.Is(ev.Err, location.ErrIndeterminate):
			w.state = writeReading
			return []Effect{ReadRecord{Key: w.key}}
		}
		return w.end(WriteFailed, 0, StoreError(w.verb+" "+w.key.String(), ev.Err))

	case RecordRead:
		if w.state != writeReading {
			return nil
		}
		switch {
		case ev.Err == nil && w.mine(ev.Record.Record):
			return w.end(Applied, ev.Record.Version, nil)
		case ev.Err == nil, errors.Is(ev.Err, location.ErrNotFound):
			return w.end(Lost, 0, nil)
		}
		w.lastErr = ev.Err
		if w.expired || passed(w.deadline, ev.Now) {
			return w.end(WriteFailed, 0, w.unknown())
		}
		w.state = writeWaiting
		return []Effect{StartTimer{Timer: TimerSettle, After: w.backoff}}

	case TimerFired:
		switch ev.Timer {
		case TimerSettle:
			if w.state != writeWaiting {
				return nil
			}
			w.state = writeReading
			return []Effect{ReadRecord{Key: w.key}}
		case TimerDeadline:
			w.expired = true
			if w.state == writeWaiting {
				return w.end(WriteFailed, 0, w.unknown())
			}
		}
	}
	return nil
}

// unknown is the error of a write whose outcome was still unknown at its
// deadline: DeadlineExceeded (outcome unknown: it may have landed), with
// the last store error's text but not its class (roamerr.Wrap). That is
// Unavailable, which to an activation's caller says that its message did
// not run (docs/FAULTS.md); the simulation's seed 802 caught the two
// classes together.
func (w *Write) unknown() error {
	return roamerr.Wrap(roamerr.ErrDeadlineExceeded, fmt.Sprintf("the outcome of a write to %s is unknown", w.key), w.lastErr)
}

func (w *Write) end(o Outcome, v location.StoreVersion, err error) []Effect {
	settling := w.state == writeWaiting
	w.state, w.outcome, w.version, w.err = writeDone, o, v, err
	var effects []Effect
	if settling {
		effects = append(effects, StopTimer{Timer: TimerSettle})
	}
	if w.alone {
		effects = append(effects, Finish{Err: err})
	}
	return effects
}
