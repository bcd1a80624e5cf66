package testwait

import (
	"testing"
	"time"

	"github.com/roamactors/roam/internal/machine"
)

// Advance moves a logical clock forward by d in steps of at most step,
// and after each step waits until every settled holds (a node's lease
// loop has taken its Ticks and answers: meshnode.Node.Settled). A step
// must be short against what the nodes time on the clock (a fraction of
// their lease's renewal period), as real time is: a node's renewal is
// sent and answered before the next is due. Leave out a node whose store
// does not answer (cut off): it settles only when its renewal times out.
func Advance(t testing.TB, clock *machine.Manual, d, step time.Duration, settled ...func() bool) {
	t.Helper()
	for d > 0 {
		s := min(d, step)
		clock.Advance(s)
		d -= s
		for _, ok := range settled {
			Within(t, 10*time.Second, ok, "the nodes settled after a step of the logical clock")
		}
	}
}
