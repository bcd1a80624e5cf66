package location_test

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/roamactors/roam/internal/roamerrtest"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

func assertOneClass(t *testing.T, err, want error) {
	t.Helper()
	roamerrtest.AssertOneClass(t, err, want)
}

// Each store error is in exactly one roamerr class (roamerr's package
// documentation), as it is and as a Store wraps it, while the finer store
// classes still tell themselves apart.
// Reference: roamerr's class table.
func TestStoreErrorsAreInOneRoamClass(t *testing.T) {
	conflict := &location.ConflictError{Op: "apply"}
	for _, c := range []struct {
		err   error
		class error
		also  []error // the store classes it matches besides itself
		not   []error // store classes it must not match
	}{
		{location.ErrConflict, roamerr.ErrConflict, nil, nil},
		{conflict, roamerr.ErrConflict, []error{location.ErrConflict}, nil},
		{location.ErrUnavailable, roamerr.ErrUnavailable, nil, []error{location.ErrIndeterminate, location.ErrLeaseEnded, location.ErrFenced}},
		{location.ErrIndeterminate, roamerr.ErrUnavailable, nil, []error{location.ErrUnavailable}},
		{location.ErrLeaseEnded, roamerr.ErrUnavailable, []error{location.ErrUnavailable}, []error{location.ErrIndeterminate, location.ErrFenced}},
		{location.ErrFenced, roamerr.ErrUnavailable, []error{location.ErrUnavailable}, []error{location.ErrIndeterminate, location.ErrLeaseEnded}},
		{location.ErrNotFound, roamerr.ErrNotFound, nil, nil},
		{location.ErrInvalid, roamerr.ErrInvalidOperation, nil, []error{location.ErrPermissionDenied}},
		{location.ErrPermissionDenied, roamerr.ErrPermissionDenied, []error{location.ErrInvalid}, []error{location.ErrUnavailable, location.ErrIndeterminate}},
		{location.ErrTooLarge, roamerr.ErrCapacityExceeded, nil, nil},
	} {
		t.Run(c.err.Error(), func(t *testing.T) {
			wrapped := fmt.Errorf("%w: apply: %w", c.err, io.ErrUnexpectedEOF) // as a Store wraps a client error
			for _, err := range []error{c.err, wrapped, fmt.Errorf("context: %w", wrapped)} {
				assertOneClass(t, err, c.class)
				if !errors.Is(err, c.err) {
					t.Fatalf("%q lost its store class", err)
				}
				for _, also := range c.also {
					if !errors.Is(err, also) {
						t.Fatalf("%q does not match %q", err, also)
					}
				}
				for _, not := range c.not {
					if errors.Is(err, not) {
						t.Fatalf("%q matches %q", err, not)
					}
				}
				if got := roamerr.Code(err); got != roamerr.Code(c.class) {
					t.Fatalf("Code(%q) = %q, want %q", err, got, roamerr.Code(c.class))
				}
			}
			if !errors.Is(wrapped, io.ErrUnexpectedEOF) {
				t.Fatal("the client error is kept")
			}
		})
	}
	var ce *location.ConflictError
	if !errors.As(fmt.Errorf("x: %w", conflict), &ce) || ce != conflict {
		t.Fatal("a *ConflictError is found with errors.As")
	}
}

// A read of a missing key fails with KeyNotFound: ErrNotFound, in the
// NotFound class, naming the key.
func TestKeyNotFoundIsNotFound(t *testing.T) {
	var err error = &location.KeyNotFound{Key: location.Key(location.KindInstanceSpot, "cart-1")}
	assertOneClass(t, err, roamerr.ErrNotFound)
	if !errors.Is(err, location.ErrNotFound) {
		t.Fatalf("%v is not location.ErrNotFound", err)
	}
	if got, want := err.Error(), location.ErrNotFound.Error()+": "+location.Key(location.KindInstanceSpot, "cart-1").String(); got != want {
		t.Fatalf("message %q, want %q", got, want)
	}
}
