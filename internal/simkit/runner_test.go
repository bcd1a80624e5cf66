package simkit

import (
	"fmt"
	"strings"
	"testing"
)

// recTB records what a runner reports instead of failing the test (any
// other method of testing.TB panics on the nil one it embeds).
type recTB struct {
	testing.TB
	errs, logs []string
}

func (r *recTB) Helper()                      {}
func (r *recTB) Errorf(f string, args ...any) { r.errs = append(r.errs, fmt.Sprintf(f, args...)) }
func (r *recTB) Error(args ...any)            { r.errs = append(r.errs, fmt.Sprint(args...)) }
func (r *recTB) Logf(f string, args ...any)   { r.logs = append(r.logs, fmt.Sprintf(f, args...)) }

type counts struct {
	Runs, Steps int
	Name        string
}

// fakeRun: seeds divisible by 7 break "seven" (one in 7 of them also a
// known one), seed 10 breaks "ten"; others run clean.
func fakeRun(seed uint64, tracing bool) Result[counts] {
	r := Result[counts]{Stats: counts{Runs: 1, Steps: 2, Name: "x"}, Steps: 2}
	if seed%7 == 0 {
		r.Violations = append(r.Violations, Violation{Invariant: "seven", Detail: fmt.Sprintf("seed %d", seed)})
	}
	if seed == 10 {
		r.Violations = append(r.Violations, Violation{Invariant: "ten"})
	}
	if seed%49 == 0 {
		r.Violations = []Violation{{Invariant: "seven", Known: "D7"}}
	}
	if tracing {
		r.Trace = fmt.Sprintf("line 1\ntrace of seed %d", seed)
	}
	return r
}

// The runner sums the counts, counts known violations, and fails naming
// each failing seed in order with its replay command and, for each first
// invariant broken, the violations and the end of the trace.
func TestRunSeedsReportsFailingSeeds(t *testing.T) {
	rec := &recTB{}
	sum := RunSeeds[counts](rec, Options[counts]{Name: "fake", Schedules: 50, Seed0: 1, Workers: 3,
		Replay: func(seed uint64) string { return fmt.Sprintf("replay %d", seed) }}, fakeRun)
	if want := []uint64{7, 10, 14, 21, 28, 35, 42}; fmt.Sprint(sum.Failed) != fmt.Sprint(want) {
		t.Fatalf("failed seeds %v, want %v", sum.Failed, want)
	}
	if sum.Stats.Runs != 50 || sum.Stats.Steps != 100 || sum.Steps != 100 || sum.Stats.Name != "" {
		t.Fatalf("summed %+v (steps %d), want 50 runs, 100 steps, the string left alone", sum.Stats, sum.Steps)
	}
	if sum.Known["D7"] != 1 {
		t.Fatalf("known %v, want D7 once", sum.Known)
	}
	all := strings.Join(rec.errs, "\n")
	for _, want := range []string{"7 of 50 schedules broke an invariant", "seed 7 — replay: replay 7", "trace of seed 7",
		"seed 10 — replay: replay 10", "ten", "trace of seed 10"} {
		if !strings.Contains(all, want) {
			t.Errorf("the report lacks %q:\n%s", want, all)
		}
	}
	if strings.Contains(all, "trace of seed 14") {
		t.Errorf("the report traces a second seed of one invariant:\n%s", all)
	}
	if logs := strings.Join(rec.logs, "\n"); !strings.Contains(logs, "failing seed 42: 0.000ms seven: seed 42 (replay 42)") {
		t.Errorf("the list of failing seeds lacks seed 42:\n%s", logs)
	}

	clean := &recTB{}
	RunSeeds[counts](clean, Options[counts]{Name: "fake", Schedules: 6, Seed0: 1, Replay: func(uint64) string { return "" }}, fakeRun)
	if len(clean.errs) > 0 {
		t.Fatalf("clean seeds 1..6 reported %v", clean.errs)
	}
}

// The known-defect checks: a fixed defect's probe that finds it fails; an
// open defect always fails; a fixed defect's seed must run clean, an open
// one's must still show it.
func TestDefects(t *testing.T) {
	ds := Defects{
		{Name: "fixed-back", Probe: func() bool { return true }},
		{Name: "fixed-gone", Probe: func() bool { return false }},
		{Name: "open", Open: true, Probe: func() bool { return true }},
		{Name: "documented", Documented: "here", Probe: func() bool { return true }},
		{Name: "driver-rule"},
	}
	rec := &recTB{}
	ds.CheckFixed(rec)
	if len(rec.errs) != 1 || !strings.Contains(rec.errs[0], "fixed-back") {
		t.Fatalf("CheckFixed reported %v, want fixed-back only", rec.errs)
	}
	rec = &recTB{}
	ds.CheckOpen(rec)
	if len(rec.errs) != 1 || !strings.Contains(rec.errs[0], `"open"`) {
		t.Fatalf("CheckOpen reported %v, want open only", rec.errs)
	}
	if !ds.Accepted("open") || !ds.Accepted("documented") || ds.Accepted("fixed-gone") || ds.Accepted("nonesuch") || ds.Present("driver-rule") {
		t.Fatal("Accepted or Present wrong")
	}
	replay := func(seed uint64) string { return fmt.Sprint("replay ", seed) }
	bad := []Violation{{Invariant: "x"}}
	known := []Violation{{Invariant: "x", Known: "open"}}
	for _, c := range []struct {
		defect string
		vs     []Violation
		fails  bool
	}{
		{"fixed-gone", nil, false},
		{"fixed-gone", bad, true},
		{"fixed-gone", known, true},
		{"open", known, false},
		{"open", nil, true},
		{"open", append(known, bad...), true},
		{"documented", nil, false},
		{"documented", bad, true},
	} {
		if p := ds.SeedProblem(c.defect, 5, c.vs, replay); (p != "") != c.fails {
			t.Errorf("%s with %v: problem %q, want a problem %v", c.defect, c.vs, p, c.fails)
		}
	}
}

// fakeWorld traces lines lines; with drift, each run of the same seed
// traces something else.
type fakeWorld struct {
	Harness
	lines int
	drift *int
}

func (w *fakeWorld) Run() []Violation {
	for i := range w.lines {
		w.Tracef("step %d", i)
	}
	if w.drift != nil {
		*w.drift++
		w.Tracef("run %d", *w.drift)
	}
	return w.Violations()
}

func (w *fakeWorld) Stats() counts { return counts{Runs: 1, Steps: w.Steps()} }

func TestCheckSameSeedSameTrace(t *testing.T) {
	drift := 0
	for _, tc := range []struct {
		name  string
		w     func() *fakeWorld
		fails string
	}{
		{"replays", func() *fakeWorld { return &fakeWorld{lines: 60} }, ""},
		{"differs", func() *fakeWorld { return &fakeWorld{lines: 60, drift: &drift} }, "two runs differ"},
		{"short", func() *fakeWorld { return &fakeWorld{lines: 10} }, "too short"},
	} {
		r := &recTB{}
		CheckSameSeedSameTrace(r, func(uint64) World[counts] { return tc.w() }, 1, 2)
		switch {
		case tc.fails == "" && len(r.errs) > 0:
			t.Errorf("%s: %v", tc.name, r.errs)
		case tc.fails != "" && (len(r.errs) != 1 || !strings.Contains(r.errs[0], tc.fails)):
			t.Errorf("%s: errors %q, want one with %q", tc.name, r.errs, tc.fails)
		}
	}
}

func TestLogKnown(t *testing.T) {
	ds := Defects{{Name: "b open", Open: true}, {Name: "a documented", Documented: "docs/X.md"}}
	r := &recTB{}
	ds.LogKnown(r, "sim", map[string]int{"b open": 2, "a documented": 3})
	want := []string{`sim: documented behaviour "a documented" (docs/X.md): 3 violations`,
		`sim: OPEN DEFECT "b open": 2 violations (counted here; TestOpenDefects fails while it is open)`}
	if strings.Join(r.logs, "\n") != strings.Join(want, "\n") {
		t.Errorf("logged %q, want %q", r.logs, want)
	}
}
