package simkit

import (
	"fmt"
	"maps"
	"slices"
	"testing"
)

// Defect is one defect a simulation found. A violation is marked Known
// (its instance) only while the defect is accepted: open or documented. A
// fixed defect that comes back is an unknown violation, which fails the
// random test and the defect's seeds, and where a probe can find it, the
// fixed-defect check too.
type Defect struct {
	// Name is the defect's one-line description (a violation's Known).
	Name string
	// Seeds are random schedules that showed it. Seeds are tied to the
	// simulation's draws: a change of the simulation may move them (then
	// search again with SIM_SCHEDULES and the known-defect counts the
	// random test prints).
	Seeds []uint64
	// Open: the defect is still in the tree. Its violations are counted,
	// not failed, by the random test, so that it still finds other defects;
	// CheckOpen fails for as long as it is listed.
	Open bool
	// Documented says where the protocol states this behaviour as its own:
	// its violations are accepted for good.
	Documented string
	// Probe reports whether the machine in the tree has the defect. Nil
	// for a defect that lived in a driver rule the model has: its seeds and
	// the random test guard it.
	Probe func() bool
}

// Defects is a simulation's table of the defects it found.
type Defects []Defect

// Find returns the defect named name, or nil.
func (ds Defects) Find(name string) *Defect {
	for i := range ds {
		if ds[i].Name == name {
			return &ds[i]
		}
	}
	return nil
}

// Open reports whether the defect is listed as still in the tree.
func (ds Defects) Open(name string) bool {
	d := ds.Find(name)
	return d != nil && d.Open
}

// Accepted reports whether violations of the defect are marked Known: it
// is open or documented.
func (ds Defects) Accepted(name string) bool {
	d := ds.Find(name)
	return d != nil && (d.Open || d.Documented != "")
}

// Present reports whether the defect's probe finds it in the tree (false
// for a defect without a probe).
func (ds Defects) Present(name string) bool {
	d := ds.Find(name)
	return d != nil && d.Probe != nil && d.Probe()
}

// CheckSeeds runs every defect's seeds, each in a subtest, with the trace
// on (run gives a seed's violations and trace), and fails a seed on what
// SeedProblem finds.
func (ds Defects) CheckSeeds(t *testing.T, replay func(seed uint64) string, run func(seed uint64) ([]Violation, string)) {
	t.Helper()
	for _, d := range ds {
		for _, seed := range d.Seeds {
			t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
				vs, trace := run(seed)
				if p := ds.SeedProblem(d.Name, seed, vs, replay); p != "" {
					t.Fatalf("%s\ntrace tail:\n%s", p, Tail(trace, 60))
				}
			})
		}
	}
}

// SeedProblem says what is wrong with the violations vs of a seed of the
// defect ("" if nothing). A fixed defect's seed must run clean: a
// violation there is the defect back, or another one. An accepted
// defect's seed may show it and nothing else; an open one's must still
// show it, or it is fixed and must leave the open ones.
func (ds Defects) SeedProblem(defect string, seed uint64, vs []Violation, replay func(seed uint64) string) string {
	if !ds.Accepted(defect) {
		if len(vs) > 0 {
			return fmt.Sprintf("seed %d of the fixed defect %q has violations (replay: %s): %v", seed, defect, replay(seed), vs)
		}
		return ""
	}
	if u := Unknown(vs); len(u) > 0 {
		return fmt.Sprintf("seed %d (%s): %v", seed, replay(seed), u)
	}
	if !ds.Open(defect) {
		return ""
	}
	for _, v := range vs {
		if v.Known == defect {
			return "" // CheckOpen reports it
		}
	}
	return fmt.Sprintf("seed %d no longer shows the open defect %q: fixed? take it out of the open ones", seed, defect)
}

// CheckFixed fails for every fixed defect whose probe finds it in the tree
// again, whatever a random schedule happens to draw.
func (ds Defects) CheckFixed(t testing.TB) {
	t.Helper()
	for _, d := range ds {
		if !ds.Accepted(d.Name) && ds.Present(d.Name) {
			t.Errorf("the fixed defect %q is back: the probe of the machine finds it", d.Name)
		}
	}
}

// CheckOpen fails for every open defect: an open defect is a failure for
// as long as it is listed, not a count in a log nobody reads.
func (ds Defects) CheckOpen(t testing.TB) {
	t.Helper()
	for _, d := range ds {
		if d.Open {
			t.Errorf("OPEN DEFECT in the tree: %q; its violations are counted, not failed, by the random test", d.Name)
		}
	}
}

// LogKnown logs, by defect in name order, the violations a random run
// marked Known (known: their counts by defect): an open defect's as
// counted while it is open, a documented one's with where it is
// documented. name prefixes every line ("sim", "spot sim").
func (ds Defects) LogKnown(t testing.TB, name string, known map[string]int) {
	t.Helper()
	for _, k := range slices.Sorted(maps.Keys(known)) {
		if d := ds.Find(k); d != nil && d.Open {
			t.Logf("%s: OPEN DEFECT %q: %d violations (counted here; TestOpenDefects fails while it is open)", name, k, known[k])
		} else if d != nil {
			t.Logf("%s: documented behaviour %q (%s): %d violations", name, k, d.Documented, known[k])
		}
	}
}
