// Package roamerr holds the error classes every roam API returns; match
// them with errors.Is. Packages wrap them with context
// (fmt.Errorf("...: %w", roamerr.ErrUnavailable)).
package roamerr

import "errors"

var (
	// ErrNotFound: the Spot, Actor, node or kind does not exist.
	ErrNotFound = errors.New("roam: not found")
	// ErrInvalidOperation: the call is not allowed in the current state or
	// with these arguments (reserved IDs, wrong generation, bad config).
	ErrInvalidOperation = errors.New("roam: invalid operation")
	// ErrTypeMismatch: a message or state is not of the expected type (a
	// message that cannot cross nodes, a stable type that differs).
	ErrTypeMismatch = errors.New("roam: type mismatch")
	// ErrUnavailable: the object or a node it needs cannot serve now;
	// retrying later may succeed.
	ErrUnavailable = errors.New("roam: unavailable")
	// ErrOwnerEnding, always with ErrUnavailable: the object's owner lost
	// its lease moments ago. Other nodes take an ended owner's objects over
	// only a lease TTL after they first see it gone (the store may end a
	// lease early, while the owner still serves); retry after that.
	ErrOwnerEnding = errors.New("roam: the owner's lease ended moments ago")
	// ErrDeadlineExceeded: the operation's deadline passed.
	ErrDeadlineExceeded = errors.New("roam: deadline exceeded")
	// ErrCapacityExceeded: no node has room.
	ErrCapacityExceeded = errors.New("roam: capacity exceeded")
	// ErrStale: a route, generation or relocation is no longer current.
	ErrStale = errors.New("roam: stale")
	// ErrConflict: a concurrent change won, or two declarations of the same
	// identity disagree.
	ErrConflict = errors.New("roam: conflict")
	// ErrAlreadyExists: a create found the ID taken.
	ErrAlreadyExists = errors.New("roam: already exists")
	// ErrNotConfigured: a mesh, kind or policy the call needs is not set up.
	ErrNotConfigured = errors.New("roam: not configured")
	// ErrPermissionDenied: a backing service refused roam's credentials
	// (the Location Store's Consul ACL token lacks a rule, or is unknown),
	// or a node refused a peer that is not a live member of its mesh at the
	// address it speaks from. Retrying with the same credentials fails the
	// same way.
	ErrPermissionDenied = errors.New("roam: permission denied")
)
