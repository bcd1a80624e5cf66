package roamerr

import (
	"errors"
	"fmt"
	"testing"
)

// A class crosses nodes by its wire code; ErrOwnerEnding keeps both itself
// and its class, Unavailable, so a caller can wait for a takeover.
func TestCodesRoundTrip(t *testing.T) {
	for _, c := range codes {
		err := FromCode(Code(fmt.Errorf("%w: detail", c.err)), "detail")
		if !errors.Is(err, c.err) {
			t.Fatalf("%s: %v does not match its class", c.code, err)
		}
	}
	ending := FromCode(Code(fmt.Errorf("%w: %w: x", ErrUnavailable, ErrOwnerEnding)), "x")
	if !errors.Is(ending, ErrUnavailable) || !errors.Is(ending, ErrOwnerEnding) {
		t.Fatalf("owner_ending lost its class or itself: %v", ending)
	}
	if errors.Is(FromCode("unavailable", "x"), ErrOwnerEnding) {
		t.Fatal("a plain Unavailable is not an ending owner")
	}
}
