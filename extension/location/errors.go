package location

import (
	"errors"
	"fmt"
	"strings"
)

// The error classes every Store returns; match them with errors.Is.
var (
	// ErrConflict: a compare-and-set or transaction precondition did not hold;
	// nothing was written. The error is a *ConflictError with current records.
	ErrConflict = errors.New("location: conflict")
	// ErrUnavailable: the store could not be reached and the operation was
	// not applied. Retrying is safe.
	ErrUnavailable = errors.New("location: unavailable")
	// ErrIndeterminate: a write was sent but its outcome is unknown (EOF,
	// 5xx, timeout). The caller must re-read consistently and look for its
	// own write before deciding (DESIGN §3); a Store never guesses.
	ErrIndeterminate = errors.New("location: outcome indeterminate")
	// ErrNotFound: the key, node or lease does not exist.
	ErrNotFound = errors.New("location: not found")
	// ErrInvalid: the request itself is malformed; nothing was attempted.
	ErrInvalid = errors.New("location: invalid request")
	// ErrLeaseEnded: a transaction's lease check failed — the writer's owner
	// lease has ended (or never held its descriptor); nothing was written.
	// The writer's lifecycle is over: it must stop serving and never retry
	// the write under that lease. It is also ErrUnavailable for callers
	// that only tell "retry later" apart.
	ErrLeaseEnded = leaseEnded{}
	// ErrTooLarge: a value, transaction or page is over a limit; nothing
	// was written.
	ErrTooLarge = errors.New("location: too large")
)

// ConflictError is returned when a precondition failed. Current holds the
// state of the keys involved as read right after the failure (Version 0 =
// absent); FailedOps lists the indexes of the operations that failed, when
// the store reports them.
type ConflictError struct {
	Op        string
	Current   []Versioned
	FailedOps []int
}

func (e *ConflictError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "location: conflict in %s", e.Op)
	if len(e.FailedOps) > 0 {
		fmt.Fprintf(&b, " (failed ops %v)", e.FailedOps)
	}
	for _, c := range e.Current {
		fmt.Fprintf(&b, "; %s at version %d", c.Key, c.Version)
	}
	return b.String()
}

// Is makes errors.Is(err, ErrConflict) true.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// CurrentOf returns the current state of key carried by the conflict.
func (e *ConflictError) CurrentOf(key AuthorityKey) (Versioned, bool) {
	for _, c := range e.Current {
		if c.Key == key {
			return c, true
		}
	}
	return Versioned{}, false
}

// leaseEnded is ErrLeaseEnded; it also matches ErrUnavailable, so a caller
// that only knows the store's retry classes still retries elsewhere.
type leaseEnded struct{}

func (leaseEnded) Error() string        { return "location: owner lease ended" }
func (leaseEnded) Is(target error) bool { return target == ErrUnavailable }
