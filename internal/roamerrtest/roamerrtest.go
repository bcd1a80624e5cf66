// Package roamerrtest checks, in tests, that an error roam returns is in
// exactly one roamerr class (roamerr's package documentation).
package roamerrtest

import (
	"errors"
	"testing"

	"github.com/roamactors/roam/roamerr"
)

// ClassesOf returns every class err matches, in roamerr.Classes order.
func ClassesOf(err error) []error {
	var in []error
	for _, c := range roamerr.Classes() {
		if errors.Is(err, c) {
			in = append(in, c)
		}
	}
	return in
}

// AssertOneClass fails t unless err matches want and no other class.
// want may be a refinement (roamerr.ErrOwnerEnding, ErrNodeDraining): err
// must then match it and, as its only class, roamerr.ErrUnavailable.
func AssertOneClass(t testing.TB, err, want error) {
	t.Helper()
	if err == nil {
		t.Fatalf("want an error of class %v, got nil", want)
	}
	class := want
	if roamerr.IsRefinement(want) {
		if !errors.Is(err, want) {
			t.Fatalf("%q does not match %v", err, want)
		}
		class = roamerr.ErrUnavailable
	}
	in := ClassesOf(err)
	if len(in) != 1 || in[0] != class {
		t.Fatalf("%q matches the classes %v; want exactly %v", err, in, class)
	}
}
