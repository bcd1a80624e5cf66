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
	// own write before deciding (docs/PROTOCOL.md §3.3); a Store never guesses.
	ErrIndeterminate = errors.New("location: outcome indeterminate")
	// ErrNotFound: the key, node or lease does not exist.
	ErrNotFound = errors.New("location: not found")
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
	// a reset connection.)
	ErrInvalid = errors.New("location: invalid request")
	// ErrPermissionDenied: the store refused the request's credentials —
	// Consul's ACLs (HTTP 403, "Permission denied" for a token without
	// the rule the operation needs, "ACL not found" for an unknown token);
	// nothing was written. A Store reports it rather than an empty answer
	// where it can tell that its results were filtered. Retrying with the
	// same credentials fails the same way, so it is also ErrInvalid for
	// callers that only tell "do not retry" apart; it is never
	// ErrUnavailable or ErrIndeterminate.
	ErrPermissionDenied = permissionDenied{}
	// ErrLeaseEnded: a transaction's lease check failed — the writer's owner
	// lease has ended (or never held its descriptor); nothing was written.
	// The writer's lifecycle is over: it must stop serving and never retry
	// the write under that lease. It is also ErrUnavailable for callers
	// that only tell "retry later" apart.
	ErrLeaseEnded = leaseEnded{}
	// ErrNodeNameTaken, always with ErrConflict: ClaimNode found the
	// descriptor's name held by a live node of its mesh; nothing was
	// written.
	ErrNodeNameTaken = errors.New("location: node name taken")
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

// permissionDenied is ErrPermissionDenied; it also matches ErrInvalid, so a
// caller that only knows the store's older classes does not retry it.
type permissionDenied struct{}

func (permissionDenied) Error() string        { return "location: permission denied" }
func (permissionDenied) Is(target error) bool { return target == ErrInvalid }
