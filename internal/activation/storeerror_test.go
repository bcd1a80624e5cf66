package activation

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/roamactors/roam/internal/roamerrtest"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// StoreError gives every store failure exactly one class: the store
// error's own (roamerr's class table), DeadlineExceeded once the context
// ended (the store error's text kept, not its class), Unavailable for an
// error of no class. An unknown write's failure is DeadlineExceeded alone:
// with Unavailable too, its caller would read "not run" (the Spot
// simulation's seed 802).
// Reference: roamerr's class table; docs/FAULTS.md (DeadlineExceeded,
// outcome unknown, not Unavailable).
func TestStoreErrorHasOneClass(t *testing.T) {
	for _, c := range []struct {
		err  error
		want error
	}{
		{fmt.Errorf("%w: read", location.ErrUnavailable), roamerr.ErrUnavailable},
		{fmt.Errorf("%w: apply", location.ErrIndeterminate), roamerr.ErrUnavailable},
		{fmt.Errorf("%w: apply", location.ErrLeaseEnded), roamerr.ErrUnavailable},
		{&location.ConflictError{Op: "apply"}, roamerr.ErrConflict},
		{fmt.Errorf("%w: read", location.ErrNotFound), roamerr.ErrNotFound},
		{fmt.Errorf("%w: read", location.ErrInvalid), roamerr.ErrInvalidOperation},
		{fmt.Errorf("%w: read", location.ErrPermissionDenied), roamerr.ErrPermissionDenied},
		{fmt.Errorf("%w: apply", location.ErrTooLarge), roamerr.ErrCapacityExceeded},
		{fmt.Errorf("%w: partitioned: %w", location.ErrUnavailable, context.DeadlineExceeded), roamerr.ErrDeadlineExceeded},
		{fmt.Errorf("%w: apply: %w", location.ErrIndeterminate, context.Canceled), roamerr.ErrDeadlineExceeded},
		{context.DeadlineExceeded, roamerr.ErrDeadlineExceeded},
		{errors.New("a store that breaks its contract"), roamerr.ErrUnavailable},
		{fmt.Errorf("%w: %w: seen gone", roamerr.ErrUnavailable, roamerr.ErrOwnerEnding), roamerr.ErrOwnerEnding},
	} {
		err := StoreError("what", c.err)
		roamerrtest.AssertOneClass(t, err, c.want)
		if c.want != roamerr.ErrDeadlineExceeded && !errors.Is(err, c.err) {
			t.Fatalf("%q lost the store error %q", err, c.err)
		}
	}

	w := &Write{key: location.Key(location.KindInstanceSpot, "s"), lastErr: fmt.Errorf("%w: apply", location.ErrIndeterminate)}
	roamerrtest.AssertOneClass(t, w.unknown(), roamerr.ErrDeadlineExceeded)
	if roamerr.Code(w.unknown()) != roamerr.CodeDeadlineExceeded {
		t.Fatalf("an unknown write crosses as %q", roamerr.Code(w.unknown()))
	}
}
