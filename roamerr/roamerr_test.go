package roamerr_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/asynkron/protoactor-go/cluster"

	"github.com/roamactors/roam/internal/roamerrtest"
	"github.com/roamactors/roam/roamerr"
)

func assertOneClass(t *testing.T, err, want error) {
	t.Helper()
	roamerrtest.AssertOneClass(t, err, want)
}

// The package documentation's table: every class, its wire code (the
// literal is the wire format, which must not change) and the refinement.
var table = []struct {
	err   error
	class error // err's class: err itself, or ErrUnavailable for the refinement
	code  string
	wire  string
}{
	{roamerr.ErrNotFound, roamerr.ErrNotFound, roamerr.CodeNotFound, "not_found"},
	{roamerr.ErrInvalidOperation, roamerr.ErrInvalidOperation, roamerr.CodeInvalidOperation, "invalid_operation"},
	{roamerr.ErrTypeMismatch, roamerr.ErrTypeMismatch, roamerr.CodeTypeMismatch, "type_mismatch"},
	{roamerr.ErrUnavailable, roamerr.ErrUnavailable, roamerr.CodeUnavailable, "unavailable"},
	{roamerr.ErrDeadlineExceeded, roamerr.ErrDeadlineExceeded, roamerr.CodeDeadlineExceeded, "deadline_exceeded"},
	{roamerr.ErrCapacityExceeded, roamerr.ErrCapacityExceeded, roamerr.CodeCapacityExceeded, "capacity_exceeded"},
	{roamerr.ErrStale, roamerr.ErrStale, roamerr.CodeStale, "stale"},
	{roamerr.ErrConflict, roamerr.ErrConflict, roamerr.CodeConflict, "conflict"},
	{roamerr.ErrAlreadyExists, roamerr.ErrAlreadyExists, roamerr.CodeAlreadyExists, "already_exists"},
	{roamerr.ErrNotConfigured, roamerr.ErrNotConfigured, roamerr.CodeNotConfigured, "not_configured"},
	{roamerr.ErrPermissionDenied, roamerr.ErrPermissionDenied, roamerr.CodePermissionDenied, "permission_denied"},
	{fmt.Errorf("%w: %w", roamerr.ErrUnavailable, roamerr.ErrOwnerEnding), roamerr.ErrUnavailable, roamerr.CodeOwnerEnding, "owner_ending"},
	{fmt.Errorf("%w: %w", roamerr.ErrUnavailable, roamerr.ErrNodeDraining), roamerr.ErrUnavailable, roamerr.CodeNodeDraining, "node_draining"},
	{fmt.Errorf("%w: %w", roamerr.ErrUnavailable, roamerr.ErrBusy), roamerr.ErrUnavailable, roamerr.CodeBusy, "busy"},
}

// Each class is itself and no other, wrapped or not; Class names it; its
// code is the documented wire name and round-trips through FromCode to
// the same class (the refinement keeps itself and its class).
func TestClassTable(t *testing.T) {
	var classes []error
	for _, c := range table {
		t.Run(c.wire, func(t *testing.T) {
			want := c.class
			for _, r := range []error{roamerr.ErrOwnerEnding, roamerr.ErrNodeDraining, roamerr.ErrBusy} {
				if errors.Is(c.err, r) {
					want = r
				}
			}
			if c.code != c.wire {
				t.Fatalf("code constant %q, wire format %q", c.code, c.wire)
			}
			for _, err := range []error{c.err, fmt.Errorf("context: %w", c.err)} {
				assertOneClass(t, err, want)
				if got := roamerr.Class(err); got != c.class {
					t.Fatalf("Class(%q) = %v, want %v", err, got, c.class)
				}
				if got := roamerr.Code(err); got != c.code {
					t.Fatalf("Code(%q) = %q, want %q", err, got, c.code)
				}
			}
			back := roamerr.FromCode(c.code, "detail")
			assertOneClass(t, back, want)
			if got := roamerr.Code(back); got != c.code {
				t.Fatalf("Code(FromCode(%q)) = %q", c.code, got)
			}
		})
		if c.err == c.class {
			classes = append(classes, c.class)
		}
	}
	if got := roamerr.Classes(); fmt.Sprint(got) != fmt.Sprint(classes) {
		t.Fatalf("Classes() = %v, the table has %v", got, classes)
	}
}

func TestNoClass(t *testing.T) {
	if roamerr.Class(nil) != nil || roamerr.Class(errors.New("x")) != nil {
		t.Fatal("nil and a plain error have no class")
	}
	if got := roamerr.Code(errors.New("x")); got != roamerr.CodeUnavailable {
		t.Fatalf("an error of no class crosses as %q, want unavailable", got)
	}
	assertOneClass(t, roamerr.FromCode("no_such_code", "x"), roamerr.ErrUnavailable)
	if errors.Is(roamerr.FromCode(roamerr.CodeUnavailable, "x"), roamerr.ErrOwnerEnding) {
		t.Fatal("a plain Unavailable is not an ending owner")
	}
}

// The helper sees an error that wraps two classes.
func TestTwoClassesAreSeen(t *testing.T) {
	err := fmt.Errorf("%w: %w", roamerr.ErrDeadlineExceeded, roamerr.ErrUnavailable)
	if got := roamerrtest.ClassesOf(err); len(got) != 2 {
		t.Fatalf("ClassesOf(%q) = %v", err, got)
	}
}

var errOwn = errors.New("a sentinel of the caller's own")

// Wrap gives the caller's class and keeps a classless cause in the chain;
// a cause of another class keeps only its text. Keep gives the cause's
// class, and the fallback to a classless cause.
func TestWrapAndKeep(t *testing.T) {
	unavailable := fmt.Errorf("%w: store", roamerr.ErrUnavailable)
	ending := fmt.Errorf("%w: %w: gone", roamerr.ErrUnavailable, roamerr.ErrOwnerEnding)

	err := roamerr.Wrap(roamerr.ErrDeadlineExceeded, "write", unavailable)
	assertOneClass(t, err, roamerr.ErrDeadlineExceeded)
	if err.Error() != "roam: deadline exceeded: write: roam: unavailable: store" {
		t.Fatalf("text %q", err)
	}
	err = roamerr.Wrap(roamerr.ErrStale, "x", fmt.Errorf("y: %w", errOwn))
	assertOneClass(t, err, roamerr.ErrStale)
	if !errors.Is(err, errOwn) {
		t.Fatal("a classless cause stays in the chain")
	}
	assertOneClass(t, roamerr.Wrap(roamerr.ErrUnavailable, "x", ending), roamerr.ErrOwnerEnding)
	assertOneClass(t, roamerr.Wrap(roamerr.ErrStale, "x", ending), roamerr.ErrStale)

	err = roamerr.Keep(roamerr.ErrUnavailable, "read", fmt.Errorf("%w: acl", roamerr.ErrPermissionDenied))
	assertOneClass(t, err, roamerr.ErrPermissionDenied)
	if err.Error() != "roam: permission denied: read: roam: permission denied: acl" {
		t.Fatalf("text %q", err)
	}
	err = roamerr.Keep(roamerr.ErrUnavailable, "read", errOwn)
	assertOneClass(t, err, roamerr.ErrUnavailable)
	if !errors.Is(err, errOwn) {
		t.Fatal("a classless cause stays in the chain")
	}
	assertOneClass(t, roamerr.Keep(roamerr.ErrNotFound, "x", ending), roamerr.ErrOwnerEnding)
	if roamerr.Wrap(roamerr.ErrStale, "x", nil) != nil || roamerr.Keep(roamerr.ErrStale, "x", nil) != nil {
		t.Fatal("nil stays nil")
	}
}

// A class presents itself as Proto.Actor's grain error response, so
// that errors.Is matches the response roam answers a grain call with (a
// generated client returns it as the error): each class has a Reason of
// its own, matches that class only, and no Reason of Proto.Actor's own
// (an application's grain error) matches a class. The refinements have
// no Reason: an ending owner's response is Unavailable.
func TestGrainErrorResponsesMatchTheirClass(t *testing.T) {
	reasons := map[string]error{}
	for _, c := range roamerr.Classes() {
		var ge *cluster.GrainErrorResponse
		if !errors.As(c, &ge) {
			t.Fatalf("%v is not presented as a grain error response", c)
		}
		if !strings.HasPrefix(ge.Reason, "ROAM_") || ge.Message != c.Error() {
			t.Fatalf("%v: reason %q, message %q", c, ge.Reason, ge.Message)
		}
		if other, dup := reasons[ge.Reason]; dup {
			t.Fatalf("%v and %v share the reason %q", c, other, ge.Reason)
		}
		reasons[ge.Reason] = c
		answer := cluster.NewGrainErrorResponse(ge.Reason, "detail")
		for _, err := range []error{answer, fmt.Errorf("error request: %w", answer)} {
			assertOneClass(t, err, c)
			if got := roamerr.Code(err); got != roamerr.Code(c) {
				t.Fatalf("Code(%q) = %q", err, got)
			}
		}
		for _, r := range []error{roamerr.ErrOwnerEnding, roamerr.ErrNodeDraining, roamerr.ErrBusy} {
			if errors.Is(answer, r) {
				t.Fatalf("%q matches the refinement %v", answer, r)
			}
		}
		// cluster.FromError of an error of a class, as a generated
		// grain answers its method's error, keeps the class.
		assertOneClass(t, cluster.FromError(fmt.Errorf("own: %w", c)), c)
	}
	for _, r := range []error{roamerr.ErrOwnerEnding, roamerr.ErrNodeDraining, roamerr.ErrBusy} {
		var ge *cluster.GrainErrorResponse
		if errors.As(r, &ge) {
			t.Fatalf("the refinement %v has the reason %q", r, ge.Reason)
		}
	}
	for _, reason := range []string{
		cluster.ErrorReason_OK, cluster.ErrorReason_CANCELLED, cluster.ErrorReason_UNKNOWN, cluster.ErrorReason_INVALID_ARGUMENT,
		cluster.ErrorReason_DEADLINE_EXCEEDED, cluster.ErrorReason_NOT_FOUND, cluster.ErrorReason_ALREADY_EXISTS,
		cluster.ErrorReason_PERMISSION_DENIED, cluster.ErrorReason_RESOURCE_EXHAUSTED, cluster.ErrorReason_FAILED_PRECONDITION,
		cluster.ErrorReason_ABORTED, cluster.ErrorReason_OUT_OF_RANGE, cluster.ErrorReason_UNIMPLEMENTED, cluster.ErrorReason_INTERNAL,
		cluster.ErrorReason_UNAVAILABLE, cluster.ErrorReason_DATA_LOSS, cluster.ErrorReason_UNAUTHENTICATED,
	} {
		if c := roamerr.Class(cluster.NewGrainErrorResponse(reason, "application")); c != nil {
			t.Fatalf("Proto.Actor's reason %s matches %v", reason, c)
		}
	}
	// Other targets of errors.As are left alone.
	var plain *os.PathError
	if errors.As(roamerr.ErrNotFound, &plain) {
		t.Fatal("a class is not a *os.PathError")
	}
}
