package consulstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"

	"github.com/hashicorp/consul/api"

	"github.com/roamactors/roam/extension/location"
)

// classify maps a Consul client error onto the contract's classes. A write
// whose request may have reached the server and whose answer is missing or
// a 5xx is indeterminate: the caller must re-read (DESIGN §3). A request that
// provably never left (connection refused, context ended before sending) is
// unavailable.
func classify(op string, err error, write bool) error {
	if err == nil {
		return nil
	}
	var se api.StatusError
	if errors.As(err, &se) {
		switch {
		case se.Code == 404:
			return fmt.Errorf("%w: %s: %w", location.ErrNotFound, op, err)
		case se.Code == 413:
			return fmt.Errorf("%w: %s: %w", location.ErrTooLarge, op, err)
		case se.Code == 429:
			return fmt.Errorf("%w: %s: %w", location.ErrUnavailable, op, err)
		case se.Code >= 400 && se.Code < 500:
			return fmt.Errorf("%w: %s: %w", location.ErrInvalid, op, err)
		}
		// 5xx: the server may have applied a write before failing.
	}
	if neverSent(err) {
		return fmt.Errorf("%w: %s: %w", location.ErrUnavailable, op, err)
	}
	if write {
		return fmt.Errorf("%w: %s: %w", location.ErrIndeterminate, op, err)
	}
	return fmt.Errorf("%w: %s: %w", location.ErrUnavailable, op, err)
}

// neverSent reports a request that provably never left: the connection
// was refused or could not be made.
func neverSent(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || isDialError(err)
}

func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// ctxUnavailable reports a context that ended before a request was sent.
func ctxUnavailable(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %s: %w", location.ErrUnavailable, op, err)
	}
	return nil
}
