package mailbox

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// The ring against a slice model, from its smallest capacity up: random
// pushes at either end, pops, drains and releases keep the elements and
// their order (growth and wrap-around at capacities 4, 8, 16, ...).
func TestRingMatchesAModel(t *testing.T) {
	for seed := uint64(0); seed < 2000; seed++ {
		r := rand.New(rand.NewPCG(seed, 3))
		var q ring
		var model []any
		next := 0
		for step := 0; step < 200; step++ {
			switch r.IntN(6) {
			case 0, 1:
				q.pushBack(next)
				model = append(model, next)
				next++
			case 2:
				v, ok := q.popFront()
				if ok != (len(model) > 0) || (ok && v != model[0]) {
					t.Fatalf("seed %d step %d: pop %v %v, want %v", seed, step, v, ok, model)
				}
				if ok {
					model = model[1:]
				}
			case 3:
				k := r.IntN(7)
				vs := make([]any, k)
				for i := range vs {
					vs[i] = next
					next++
				}
				q.pushFront(vs)
				model = append(slices.Clone(vs), model...)
			case 4:
				if r.IntN(4) == 0 {
					got := q.drain()
					if !slices.Equal(got, model) && !(len(got) == 0 && len(model) == 0) {
						t.Fatalf("seed %d step %d: drain %v want %v", seed, step, got, model)
					}
					model = nil
				}
			case 5:
				q.release()
			}
			if q.len() != len(model) {
				t.Fatalf("seed %d: len %d want %d", seed, q.len(), len(model))
			}
		}
		got := q.drain()
		if !slices.Equal(got, model) && !(len(got) == 0 && len(model) == 0) {
			t.Fatalf("seed %d: final %v want %v", seed, got, model)
		}
	}
}
