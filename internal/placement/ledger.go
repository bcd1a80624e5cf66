// Package placement is the director that moves only idle objects
// (docs/PLACEMENT.md): candidate selection, the placement ledger that
// holds the global rate and concurrency budget under the store's
// compare-and-set, the policy that picks targets, and the reconciliation
// of an attempt whose answer was lost.
package placement

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/roamactors/roam/roamerr"
)

// Outcome is how an attempt ended (docs/PLACEMENT.md §4).
type Outcome string

const (
	// Busy: the source found the object busy at its seal; nothing moved.
	Busy Outcome = "busy"
	// Committed: the target's owner change is in the store.
	Committed Outcome = "committed"
	// Deferred: a limit, the target's capacity, the object's cooldown, or
	// an answer that left the source unchanged: nothing moved; it may be
	// tried again later.
	Deferred Outcome = "deferred"
	// Stale: the object's owner or generation changed since it was
	// selected, or it is gone.
	Stale Outcome = "stale"
)

// Attempt is one try to move one relocation unit: its operation ID, kept
// by every repeat, and the exact tuple it was selected with.
type Attempt struct {
	Op         string `json:"op"`
	Key        string `json:"key"` // location.AuthorityKey.String()
	SourceRid  string `json:"source"`
	SourceGen  uint64 `json:"source_gen"` // the source node's generation
	ObjectGen  uint64 `json:"object_gen"`
	OwnerGen   uint64 `json:"owner_gen"`
	TargetRid  string `json:"target"`
	DeadlineMs int64  `json:"deadline_ms"` // past it, a reservation no longer counts
}

// sameTuple reports whether a and b are one attempt apart from its
// deadline (a repeat of it).
func (a Attempt) sameTuple(b Attempt) bool {
	a.DeadlineMs, b.DeadlineMs = 0, 0
	return a == b
}

// Limits are the global limits the ledger enforces, whatever number of
// directors reserve in it.
type Limits struct {
	// Rate is the most attempts started per second, with a burst of Burst
	// (at least 1).
	Rate  float64
	Burst float64
	// Concurrency is the most attempts in flight at once.
	Concurrency int
	// Cooldown is how long after an attempt on an object ended the next
	// one on it waits.
	Cooldown time.Duration
}

// DefaultLimits: 50 attempts a second (burst 50), 8 in flight, 30 s of
// cooldown per object.
func DefaultLimits() Limits {
	return Limits{Rate: 50, Burst: 50, Concurrency: 8, Cooldown: 30 * time.Second}
}

// Validate reports an InvalidOperation for limits that could never admit
// an attempt.
func (l Limits) Validate() error {
	if l.Rate <= 0 || l.Burst < 1 || l.Concurrency < 1 || l.Cooldown < 0 {
		return fmt.Errorf("%w: placement limits need a positive rate, a burst of at least 1 and a concurrency of at least 1 (got %+v)", roamerr.ErrInvalidOperation, l)
	}
	return nil
}

// Ledger is the placement ledger as stored (a JSON note under
// location.ClusterNotes). Its fields are changed only by Reserve and
// Finish, and written back only by compare-and-set on the version read:
// two directors never both take the last token or slot.
type Ledger struct {
	// Tokens of the rate bucket at TokensAtMs (Unix milliseconds).
	Tokens     float64 `json:"tokens"`
	TokensAtMs int64   `json:"tokens_at_ms"`
	// InFlight are the reserved attempts not finished; one whose deadline
	// passed no longer counts (its director ended or lost the answer;
	// reconciliation decides it) and is dropped at the next change.
	InFlight []Attempt `json:"in_flight"`
	// Done are the last attempts' outcomes (at most maxDone), so that a
	// repeat of a finished attempt gets its outcome again.
	Done []Finished `json:"done"`
	// Cooling maps an object's key to the end of its cooldown (Unix
	// milliseconds); at most maxCooling, the expired dropped first.
	Cooling map[string]int64 `json:"cooling"`
}

// Finished is a recorded outcome.
type Finished struct {
	Attempt Attempt `json:"attempt"`
	Outcome Outcome `json:"outcome"`
}

const (
	maxDone    = 128
	keepDone   = 16
	maxCooling = 256
)

// Decode reads a ledger; empty bytes are a new ledger.
func Decode(b []byte) (*Ledger, error) {
	l := &Ledger{}
	if len(b) == 0 {
		return l, nil
	}
	if err := json.Unmarshal(b, l); err != nil {
		return nil, fmt.Errorf("%w: placement ledger: %w", roamerr.ErrInvalidOperation, err)
	}
	return l, nil
}

// Encode writes a ledger in at most limit bytes: past it, the oldest
// outcomes kept for repeats go first (down to keepDone), then the
// cooldowns that end first, then the rest of the outcomes (both only
// save work; the reservations in flight always stay).
func (l *Ledger) Encode(limit int) []byte {
	for {
		b, _ := json.Marshal(l) // plain data: cannot fail
		switch {
		case len(b) <= limit:
			return b
		case len(l.Done) > keepDone:
			l.Done = l.Done[max(1, (len(l.Done)-keepDone)/2):]
		case len(l.Cooling) > 0:
			delete(l.Cooling, soonest(l.Cooling))
		case len(l.Done) > 0:
			l.Done = l.Done[1:]
		default:
			return b
		}
	}
}

// Verdict is Reserve's answer.
type Verdict struct {
	// Go: the attempt is reserved (or was already, by this ID): ask the
	// source. Otherwise Outcome is final (a repeat of a finished attempt,
	// or Deferred with Why).
	Go      bool
	Outcome Outcome
	Why     string
}

// Reserve re-checks and reserves a at now under lim: a repeat of an
// attempt in flight goes on, a repeat of a finished one gets its outcome,
// the same ID with another tuple is a Conflict; then the object's
// cooldown, the concurrency and the rate, any of which defers it. Changed
// reports whether the ledger must be written back.
func (l *Ledger) Reserve(a Attempt, lim Limits, now time.Time) (v Verdict, changed bool, err error) {
	ms := now.UnixMilli()
	for _, f := range l.InFlight {
		if f.Op == a.Op {
			if !f.sameTuple(a) {
				return Verdict{}, false, conflict(a.Op)
			}
			return Verdict{Go: true}, false, nil
		}
	}
	for _, f := range l.Done {
		if f.Attempt.Op == a.Op {
			if !f.Attempt.sameTuple(a) {
				return Verdict{}, false, conflict(a.Op)
			}
			return Verdict{Outcome: f.Outcome, Why: "a repeat of a finished attempt"}, false, nil
		}
	}
	changed = l.expire(ms)
	if until, ok := l.Cooling[a.Key]; ok && until > ms {
		return Verdict{Outcome: Deferred, Why: fmt.Sprintf("%s cools down for %v more", a.Key, time.Duration(until-ms)*time.Millisecond)}, changed, nil
	}
	for _, f := range l.InFlight {
		if f.Key == a.Key {
			return Verdict{Outcome: Deferred, Why: a.Key + " has an attempt in flight"}, changed, nil
		}
	}
	if len(l.InFlight) >= lim.Concurrency {
		return Verdict{Outcome: Deferred, Why: fmt.Sprintf("%d attempts in flight, the limit", len(l.InFlight))}, changed, nil
	}
	tokens := l.Tokens
	if l.TokensAtMs == 0 {
		tokens = lim.Burst
	} else if ms > l.TokensAtMs {
		tokens = min(lim.Burst, tokens+lim.Rate*float64(ms-l.TokensAtMs)/1000)
	}
	if tokens < 1 {
		return Verdict{Outcome: Deferred, Why: "the rate limit"}, changed, nil
	}
	// The bucket's time never goes back: a director whose clock is behind
	// refills nothing until it catches up.
	l.Tokens, l.TokensAtMs = tokens-1, max(l.TokensAtMs, ms)
	l.InFlight = append(l.InFlight, a)
	return Verdict{Go: true}, true, nil
}

// Finish records a's outcome at now: it leaves the attempts in flight, its
// outcome is kept for repeats, and its object cools down. False if the
// ledger had it finished already (nothing to write).
func (l *Ledger) Finish(a Attempt, o Outcome, lim Limits, now time.Time) bool {
	for _, f := range l.Done {
		if f.Attempt.Op == a.Op {
			return false
		}
	}
	ms := now.UnixMilli()
	l.expire(ms)
	l.InFlight = slices.DeleteFunc(l.InFlight, func(f Attempt) bool { return f.Op == a.Op })
	l.Done = append(l.Done, Finished{Attempt: a, Outcome: o})
	if n := len(l.Done); n > maxDone {
		l.Done = slices.Clone(l.Done[n-maxDone:])
	}
	if lim.Cooldown > 0 {
		if l.Cooling == nil {
			l.Cooling = map[string]int64{}
		}
		l.Cooling[a.Key] = ms + lim.Cooldown.Milliseconds()
		for len(l.Cooling) > maxCooling {
			delete(l.Cooling, soonest(l.Cooling))
		}
	}
	return true
}

// expire drops the reservations past their deadline and the ended
// cooldowns; it reports whether anything went.
func (l *Ledger) expire(ms int64) bool {
	n := len(l.InFlight)
	l.InFlight = slices.DeleteFunc(l.InFlight, func(f Attempt) bool { return f.DeadlineMs <= ms })
	changed := len(l.InFlight) != n
	for k, until := range l.Cooling {
		if until <= ms {
			delete(l.Cooling, k)
			changed = true
		}
	}
	return changed
}

// soonest is the key whose cooldown ends first.
func soonest(m map[string]int64) string {
	best, at := "", int64(0)
	for k, v := range m {
		if best == "" || v < at || (v == at && k < best) {
			best, at = k, v
		}
	}
	return best
}

func conflict(op string) error {
	return fmt.Errorf("%w: operation %s is another attempt's", roamerr.ErrConflict, op)
}
