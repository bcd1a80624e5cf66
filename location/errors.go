package location

import (
	"fmt"
	"strings"

	"github.com/roamactors/roam/roamerr"
)

// KeyNotFound is ErrNotFound for one authority key: what a read of a
// missing key returns. It formats its message only when asked, so that a
// read that finds nothing (every cold activation's) costs no formatting.
type KeyNotFound struct{ Key AuthorityKey }

func (e *KeyNotFound) Error() string { return ErrNotFound.Error() + ": " + e.Key.String() }

// Unwrap makes KeyNotFound match ErrNotFound (and roamerr.ErrNotFound).
func (e *KeyNotFound) Unwrap() error { return ErrNotFound }

// The error classes every Store returns; match them with errors.Is. Each
// is also in exactly one roamerr class (roamerr's package documentation),
// so a store error that reaches a roam caller matches the roamerr class
// too: ErrUnavailable, ErrIndeterminate and ErrLeaseEnded are
// roamerr.ErrUnavailable; ErrNotFound roamerr.ErrNotFound; ErrConflict
// roamerr.ErrConflict; ErrInvalid roamerr.ErrInvalidOperation;
// ErrPermissionDenied roamerr.ErrPermissionDenied; ErrTooLarge
// roamerr.ErrCapacityExceeded. Code that needs the finer store class
// (indeterminate or not, lease ended or not) matches these.
var (
	// ErrConflict: a compare-and-set or transaction precondition did not hold;
	// nothing was written. The error is a *ConflictError with current records.
	// roamerr.ErrConflict.
	ErrConflict error = &storeError{"location: conflict", roamerr.ErrConflict, nil}
	// ErrUnavailable: the store could not be reached and the operation was
	// not applied. Retrying is safe. roamerr.ErrUnavailable.
	ErrUnavailable error = &storeError{"location: unavailable", roamerr.ErrUnavailable, nil}
	// ErrIndeterminate: a write was sent but its outcome is unknown (EOF,
	// 5xx, timeout). The caller must re-read consistently and look for its
	// own write before deciding (docs/PROTOCOL.md §3.3); a Store never guesses.
	// roamerr.ErrUnavailable; it is not ErrUnavailable, which says that
	// nothing was applied.
	ErrIndeterminate error = &storeError{"location: outcome indeterminate", roamerr.ErrUnavailable, nil}
	// ErrNotFound: the key, node or lease does not exist.
	// roamerr.ErrNotFound.
	ErrNotFound error = &storeError{"location: not found", roamerr.ErrNotFound, nil}
	// ErrInvalid: the request itself is malformed, or the store is
	// configured so that no request can succeed; nothing was applied, and
	// retrying the same call on the same store fails the same way. A
	// failed TLS handshake with the store (an unknown CA, a certificate
	// for another name, a client certificate the server requires and does
	// not get, plain HTTP to an HTTPS port or HTTPS to a plain one) is
	// such a configuration error: its request was never served, so even a
	// write is not indeterminate, and it is not retried as unavailable.
	// It has no class of its own: a caller can do nothing about it but
	// report it, which is what ErrInvalid already means to callers; the
	// message says it is TLS and wraps the crypto/tls or crypto/x509 error.
	// (consulstore's tlsFailed names the one refusal it cannot tell from
	// a reset connection.) roamerr.ErrInvalidOperation.
	ErrInvalid error = &storeError{"location: invalid request", roamerr.ErrInvalidOperation, nil}
	// ErrPermissionDenied: the store refused the request's credentials —
	// Consul's ACLs (HTTP 403, "Permission denied" for a token without
	// the rule the operation needs, "ACL not found" for an unknown token);
	// nothing was written. A Store reports it rather than an empty answer
	// where it can tell that its results were filtered. Retrying with the
	// same credentials fails the same way, so it is also ErrInvalid for
	// callers that only tell "do not retry" apart; it is never
	// ErrUnavailable or ErrIndeterminate. roamerr.ErrPermissionDenied (and
	// not roamerr.ErrInvalidOperation: ErrInvalid's class does not come
	// with it).
	ErrPermissionDenied error = &storeError{"location: permission denied", roamerr.ErrPermissionDenied, ErrInvalid}
	// ErrLeaseEnded: a transaction's lease check failed — the writer's owner
	// lease has ended (or never held its descriptor); nothing was written.
	// The writer's lifecycle is over: it must stop serving and never retry
	// the write under that lease. It is also ErrUnavailable for callers
	// that only tell "retry later" apart. roamerr.ErrUnavailable.
	ErrLeaseEnded error = &storeError{"location: owner lease ended", roamerr.ErrUnavailable, ErrUnavailable}
	// ErrFenced: the writer's node did not write because it cannot prove
	// its owner lease in force at this instant (a renewal is late); the
	// lease has not ended, and the same lifecycle writes again once a
	// renewal proves it. Nothing was sent to the store. It is also
	// ErrUnavailable: retry later. roamerr.ErrUnavailable.
	ErrFenced error = &storeError{"location: owner lease not provably in force", roamerr.ErrUnavailable, ErrUnavailable}
	// ErrLeaseRevoked, always with ErrNotFound: ReadNode found no
	// descriptor because another node revoked the lifecycle's lease
	// (RevokeLease) after watching it stand still for a lease TTL — proof
	// that its holder fenced itself (docs/FAULTS.md).
	// roamerr.ErrNotFound.
	ErrLeaseRevoked error = &storeError{"location: node not found: its lease was revoked", roamerr.ErrNotFound, ErrNotFound}
	// ErrNodeNameTaken, always with ErrConflict: ClaimNode found the
	// descriptor's name held by a live node of its mesh; nothing was
	// written.
	// roamerr.ErrConflict.
	ErrNodeNameTaken error = &storeError{"location: node name taken", roamerr.ErrConflict, ErrConflict}
	// ErrTooLarge: a value, transaction or page is over a limit; nothing
	// was written. roamerr.ErrCapacityExceeded.
	ErrTooLarge error = &storeError{"location: too large", roamerr.ErrCapacityExceeded, nil}
)

// storeError is each of the store's error classes: it matches its
// roamerr class and, for a refinement, the broader store class it also
// counts as (ErrLeaseEnded is ErrUnavailable, ErrPermissionDenied is
// ErrInvalid) — never that broader class's roamerr class, so it stays in
// exactly one roamerr class.
type storeError struct {
	msg   string
	class error // the roamerr class
	also  error // the broader store class, or nil
}

func (e *storeError) Error() string { return e.msg }

func (e *storeError) Is(target error) bool {
	return target == e.class || e.also != nil && target == e.also
}

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

// Is makes errors.Is(err, ErrConflict) and errors.Is(err,
// roamerr.ErrConflict) true.
func (e *ConflictError) Is(target error) bool {
	return target == ErrConflict || target == roamerr.ErrConflict
}

// CurrentOf returns the current state of key carried by the conflict.
func (e *ConflictError) CurrentOf(key AuthorityKey) (Versioned, bool) {
	for _, c := range e.Current {
		if c.Key == key {
			return c, true
		}
	}
	return Versioned{}, false
}
