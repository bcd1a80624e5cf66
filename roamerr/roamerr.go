// Package roamerr holds the error classes every roam API returns; match
// them with errors.Is. Packages wrap them with context
// (fmt.Errorf("...: %w", roamerr.ErrUnavailable)).
//
// Every error roam returns matches exactly one class, so a switch over
// errors.Is takes one branch whatever its order. The classes, their wire
// codes (Code, FromCode) and whether retrying the same call may succeed:
//
//	Class                Code               Retry may succeed?
//	ErrNotFound          not_found          no, unless the object, node or kind is created
//	ErrInvalidOperation  invalid_operation  no: the same call fails the same way
//	ErrTypeMismatch      type_mismatch      no
//	ErrUnavailable       unavailable        yes, later (after ErrOwnerEnding: a lease TTL later)
//	ErrDeadlineExceeded  deadline_exceeded  yes, but the operation may have happened: look first
//	ErrCapacityExceeded  capacity_exceeded  room: later or elsewhere; a size limit: no
//	ErrStale             stale              yes, after reading the route or generation again
//	ErrConflict          conflict           yes, after reading the current state again
//	ErrAlreadyExists     already_exists     no
//	ErrNotConfigured     not_configured     no, until the mesh, kind or policy is set up
//	ErrPermissionDenied  permission_denied  no, with the same credentials
//
// Three refinements add a second error to a class without leaving it:
// ErrOwnerEnding (code owner_ending), ErrNodeDraining (code
// node_draining) and ErrBusy (code busy) always come with ErrUnavailable.
//
// A grain call through a generated Proto.Actor grain client (or
// cluster.Request with a cluster.GrainRequest) that roam answers in the
// grain's place returns a *cluster.GrainErrorResponse: errors.Is matches
// it with its class too, since each class presents itself to errors.As as
// such a response with a Reason of its own ("ROAM_" and the code in
// capitals). A refinement is only in the response's metadata:
// roam.DeliveryError turns the response into the full error.
//
// The Location Store's errors (location) are in these classes
// too: location.ErrUnavailable, ErrIndeterminate and ErrLeaseEnded are
// ErrUnavailable; ErrNotFound is ErrNotFound; ErrConflict (and
// *location.ConflictError) is ErrConflict; ErrInvalid is
// ErrInvalidOperation; ErrPermissionDenied is ErrPermissionDenied;
// ErrTooLarge is ErrCapacityExceeded. A store error that a roam API
// passes on keeps that class (Keep); an API that judges the failure
// otherwise (a write whose outcome stayed unknown until the deadline is
// ErrDeadlineExceeded, a create that found the ID taken ErrAlreadyExists)
// keeps the store error's text, not its class (Wrap). An application's
// own error that roam reports (a state codec's, a Creator's) is wrapped
// in roam's class the same way: still in the chain when it has no class
// of its own.
package roamerr

import (
	"errors"
	"fmt"
)

var (
	// ErrNotFound: the Spot, Actor, node or kind does not exist (for a
	// node: the store has no descriptor under its RID, as for a Relocate
	// target that never existed or has stopped).
	ErrNotFound error = &class{"roam: not found", CodeNotFound}
	// ErrInvalidOperation: the call is not allowed in the current state or
	// with these arguments (reserved IDs, wrong generation, bad config, a
	// request the Location Store refuses as malformed or cannot serve as
	// configured, such as a failed TLS handshake).
	ErrInvalidOperation error = &class{"roam: invalid operation", CodeInvalidOperation}
	// ErrTypeMismatch: a message or state is not of the expected type (a
	// message that cannot cross nodes, a stable type that differs).
	ErrTypeMismatch error = &class{"roam: type mismatch", CodeTypeMismatch}
	// ErrUnavailable: the object or a node it needs cannot serve now, or
	// the Location Store could not be reached; retrying later may succeed.
	// It does not say by itself that nothing happened: an error of the
	// store may be location.ErrIndeterminate (a write whose outcome is
	// unknown), which roam settles by reading again wherever it matters.
	ErrUnavailable error = &class{"roam: unavailable", CodeUnavailable}
	// ErrOwnerEnding, always with ErrUnavailable: the object's owner lost
	// its lease moments ago. Other nodes take an ended owner's objects over
	// only a lease TTL after they first see it gone (the store may end a
	// lease early, while the owner still serves); retry after that.
	ErrOwnerEnding error = &class{"roam: the owner's lease ended moments ago", CodeOwnerEnding}
	// ErrNodeDraining, always with ErrUnavailable: the node asked to host
	// the object is draining (or stopping) and takes no new object, move or
	// activation; another node may.
	ErrNodeDraining error = &class{"roam: the node is draining", CodeNodeDraining}
	// ErrBusy, always with ErrUnavailable: a move that only an idle
	// object admits (RelocateIfIdle) found it busy — messages queued, or a
	// timer due soon — and did not start; nothing was moved. Retry when
	// the object is idle.
	ErrBusy error = &class{"roam: the object is busy", CodeBusy}
	// ErrDeadlineExceeded: the operation's deadline passed (or its context
	// ended) before its outcome was known: it may or may not have happened.
	ErrDeadlineExceeded error = &class{"roam: deadline exceeded", CodeDeadlineExceeded}
	// ErrCapacityExceeded: no node has room, or a message, record or
	// transaction is over a size limit (retrying the same one fails the
	// same way).
	ErrCapacityExceeded error = &class{"roam: capacity exceeded", CodeCapacityExceeded}
	// ErrStale: a route, generation or relocation is no longer current.
	ErrStale error = &class{"roam: stale", CodeStale}
	// ErrConflict: a concurrent change won, or two declarations of the same
	// identity disagree.
	ErrConflict error = &class{"roam: conflict", CodeConflict}
	// ErrAlreadyExists: a create found the ID taken.
	ErrAlreadyExists error = &class{"roam: already exists", CodeAlreadyExists}
	// ErrNotConfigured: a mesh, kind or policy the call needs is not set up.
	ErrNotConfigured error = &class{"roam: not configured", CodeNotConfigured}
	// ErrPermissionDenied: a backing service refused roam's credentials
	// (the Location Store's Consul ACL token lacks a rule, or is unknown),
	// or a node refused a peer that is not a live member of its mesh at the
	// address it speaks from. Retrying with the same credentials fails the
	// same way.
	ErrPermissionDenied error = &class{"roam: permission denied", CodePermissionDenied}
)

// classes are the classes, in the order of the table above.
var classes = []error{
	ErrNotFound,
	ErrInvalidOperation,
	ErrTypeMismatch,
	ErrUnavailable,
	ErrDeadlineExceeded,
	ErrCapacityExceeded,
	ErrStale,
	ErrConflict,
	ErrAlreadyExists,
	ErrNotConfigured,
	ErrPermissionDenied,
}

// Classes returns the classes (not the refinements), in
// the order of the package documentation's table.
func Classes() []error { return append([]error(nil), classes...) }

// Class returns the class err matches (for an ErrOwnerEnding error,
// ErrUnavailable), or nil for nil or an error of no class.
func Class(err error) error {
	if err == nil {
		return nil
	}
	for _, c := range classes {
		if errors.Is(err, c) {
			return c
		}
	}
	return nil
}

// Wrap returns err in class, with what before its text. err stays in
// the chain (errors.Is and errors.As still find a sentinel or type of its
// own) unless it is of another class, in which case only its text is
// kept: the result is in class alone. Wrap is for a caller that judges a
// failure itself (a write whose outcome the deadline left unknown is
// ErrDeadlineExceeded, whatever the store said); nil stays nil.
func Wrap(class error, what string, err error) error {
	if err == nil {
		return nil
	}
	if c := Class(err); c != nil && c != class {
		return fmt.Errorf("%w: %s: %v", class, what, err)
	}
	return fmt.Errorf("%w: %s: %w", class, what, err)
}

// Keep returns err in its own class, with what before its text; an error
// of no class (from outside roam) gets fallback, the class the caller
// takes it for. The text starts with the class either way ("roam:
// unavailable: read x: location: unavailable: ..."). Keep is for a caller
// that passes a failure on, such as a Location Store error, whose class
// (roamerr's package documentation) is already right; nil stays nil.
func Keep(fallback error, what string, err error) error {
	if err == nil {
		return nil
	}
	if class := Class(err); class != nil {
		return fmt.Errorf("%v: %s: %w", class, what, err)
	}
	return fmt.Errorf("%w: %s: %w", fallback, what, err)
}
