package simkit

import (
	"slices"
	"testing"
)

func TestStoreFaultsDraw(t *testing.T) {
	for _, tc := range []struct {
		f     StoreFaults
		write bool
		want  StoreMode
	}{
		{StoreFaults{}, true, ModeOK},
		{StoreFaults{PIndetApplied: 1}, true, ModeIndetApplied},
		// A read cannot apply: its share goes to the next answer.
		{StoreFaults{PIndetApplied: 1}, false, ModeIndetNotApplied},
		{StoreFaults{PIndetNotApplied: 1}, false, ModeIndetNotApplied},
		{StoreFaults{PUnavailable: 1}, true, ModeUnavailable},
		{StoreFaults{PSlow: 1}, false, ModeSlow},
		{StoreFaults{PHang: 1}, true, ModeHang},
	} {
		r, ref := NewRand(7, 1), NewRand(7, 1)
		if got := tc.f.Draw(r, tc.write); got != tc.want {
			t.Errorf("%+v write=%v: %s, want %s", tc.f, tc.write, got, tc.want)
		}
		// One draw whatever the answer: a schedule's later draws do not
		// depend on which answer a call got.
		ref.Float64()
		if r.Float64() != ref.Float64() {
			t.Errorf("%+v: Draw took other than one draw", tc.f)
		}
	}
	if got, want := StoreModeNames(ModeSlow), []string{"ok", "indeterminate-applied", "indeterminate-not-applied", "unavailable", "slow"}; !slices.Equal(got, want) {
		t.Errorf("names up to slow: %q, want %q", got, want)
	}
}

// Each chance is drawn in field order from the schedule's source; one
// without a most takes no draw, so a store model without hangs draws as
// it did before hangs had a field.
func TestDrawStoreFaults(t *testing.T) {
	r, ref := NewRand(5, 2), NewRand(5, 2)
	got := r.DrawStoreFaults(0.05, StoreFaults{PIndetApplied: 0.15, PUnavailable: 0.1, PSlow: 0.2})
	want := StoreFaults{PIndetApplied: 0.05 + ref.Float64()*0.15}
	want.PUnavailable = ref.Float64() * 0.1
	want.PSlow = ref.Float64() * 0.2
	if got != want {
		t.Errorf("drew %+v, want %+v", got, want)
	}
	if r.Float64() != ref.Float64() {
		t.Errorf("drew a chance that has no most")
	}
}
