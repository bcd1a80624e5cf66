package failpoint

import "testing"

// A rule is broken only within the test that breaks it.
func TestBreakLastsForItsTest(t *testing.T) {
	s := newSwitch("a rule")
	t.Run("breaks", func(t *testing.T) {
		s.Break(t)
		if !s.Broken() {
			t.Fatal("not broken after Break")
		}
	})
	if s.Broken() {
		t.Fatal("still broken after the test that broke it")
	}
}
