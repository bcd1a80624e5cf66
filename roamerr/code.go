package roamerr

import (
	"errors"
	"fmt"
)

// The wire codes of the classes, used where a failure crosses nodes
// (DeliveryFailed.Code, SpotReply.FailureCode; docs/PROTOCOL.md §6.6, §8).
const (
	CodeNotFound         = "not_found"
	CodeInvalidOperation = "invalid_operation"
	CodeTypeMismatch     = "type_mismatch"
	CodeUnavailable      = "unavailable"
	CodeOwnerEnding      = "owner_ending"  // ErrUnavailable refined by ErrOwnerEnding
	CodeNodeDraining     = "node_draining" // ErrUnavailable refined by ErrNodeDraining
	CodeBusy             = "busy"          // ErrUnavailable refined by ErrBusy
	CodeDeadlineExceeded = "deadline_exceeded"
	CodeCapacityExceeded = "capacity_exceeded"
	CodeStale            = "stale"
	CodeConflict         = "conflict"
	CodeAlreadyExists    = "already_exists"
	CodeNotConfigured    = "not_configured"
	CodePermissionDenied = "permission_denied"
)

// codes pairs each class (and the refinement) with its wire code.
var codes = []struct {
	err  error
	code string
}{
	{ErrOwnerEnding, CodeOwnerEnding}, // the refinements before their class, unavailable
	{ErrNodeDraining, CodeNodeDraining},
	{ErrBusy, CodeBusy},
	{ErrNotFound, CodeNotFound},
	{ErrInvalidOperation, CodeInvalidOperation},
	{ErrTypeMismatch, CodeTypeMismatch},
	{ErrUnavailable, CodeUnavailable},
	{ErrDeadlineExceeded, CodeDeadlineExceeded},
	{ErrCapacityExceeded, CodeCapacityExceeded},
	{ErrStale, CodeStale},
	{ErrConflict, CodeConflict},
	{ErrAlreadyExists, CodeAlreadyExists},
	{ErrNotConfigured, CodeNotConfigured},
	{ErrPermissionDenied, CodePermissionDenied},
}

// Code is the wire name of err's class (or of its refinement:
// CodeOwnerEnding, CodeNodeDraining); CodeUnavailable for an error of no class, since
// the receiver cannot tell more.
func Code(err error) string {
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return CodeUnavailable
}

// IsRefinement reports whether err is one of the refinements of
// ErrUnavailable (ErrOwnerEnding, ErrNodeDraining, ErrBusy) itself.
func IsRefinement(err error) bool {
	return err == ErrOwnerEnding || err == ErrNodeDraining || err == ErrBusy
}

// FromCode rebuilds a typed error from a wire code and detail: an error of
// the code's class (a refinement's code: ErrUnavailable with it),
// or ErrUnavailable for a code it does not know.
func FromCode(code, detail string) error {
	for _, c := range codes {
		if c.code == code {
			if IsRefinement(c.err) {
				return fmt.Errorf("%w: %w: %s", ErrUnavailable, c.err, detail)
			}
			return fmt.Errorf("%w: %s", c.err, detail)
		}
	}
	return fmt.Errorf("%w: %s (code %q)", ErrUnavailable, detail, code)
}
