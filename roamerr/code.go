package roamerr

import (
	"errors"
	"fmt"
)

// codes are the wire names of the classes, used where a failure crosses
// nodes (DeliveryFailed, SpotReply; docs/PROTOCOL.md §6.6, §8).
var codes = []struct {
	err  error
	code string
}{
	{ErrOwnerEnding, "owner_ending"},           // before its class, unavailable
	{ErrPermissionDenied, "permission_denied"}, // before the broader classes a wrapper may add
	{ErrNotFound, "not_found"},
	{ErrInvalidOperation, "invalid_operation"},
	{ErrTypeMismatch, "type_mismatch"},
	{ErrUnavailable, "unavailable"},
	{ErrDeadlineExceeded, "deadline_exceeded"},
	{ErrCapacityExceeded, "capacity_exceeded"},
	{ErrStale, "stale"},
	{ErrConflict, "conflict"},
	{ErrAlreadyExists, "already_exists"},
	{ErrNotConfigured, "not_configured"},
}

// Code is the wire name of err's class; "unavailable" for an error of no
// class, since the receiver cannot tell more.
func Code(err error) string {
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return "unavailable"
}

// FromCode rebuilds a typed error from a wire code and detail.
func FromCode(code, detail string) error {
	for _, c := range codes {
		if c.code == code {
			if c.err == ErrOwnerEnding {
				return fmt.Errorf("%w: %w: %s", ErrUnavailable, ErrOwnerEnding, detail)
			}
			return fmt.Errorf("%w: %s", c.err, detail)
		}
	}
	return fmt.Errorf("%w: %s (code %q)", ErrUnavailable, detail, code)
}
