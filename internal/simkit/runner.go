package simkit

import (
	"cmp"
	"flag"
	"fmt"
	"os"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// EnvInt is the integer in the environment variable name, or def if it
// is unset or not an integer.
func EnvInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

// The flags every simulation's tests take, registered once here.
var (
	flagSchedules = flag.Int("sim.schedules", EnvInt("SIM_SCHEDULES", 2000), "random schedules TestRandomSchedules runs (env SIM_SCHEDULES)")
	flagSeed0     = flag.Uint64("sim.seed0", uint64(EnvInt("SIM_SEED0", 1)), "first seed of TestRandomSchedules (env SIM_SEED0)")
	flagSeed      = flag.Int64("sim.seed", -1, "TestReplay: the seed to replay with its trace (make sim SEED=n, make sim-spot SEED=n)")
)

// Schedules is the number of random schedules to run (-sim.schedules, env
// SIM_SCHEDULES; 2000 by default).
func Schedules() int { return *flagSchedules }

// ReplaySeed is the seed TestReplay replays (-sim.seed); ok is false if
// none was given.
func ReplaySeed() (seed uint64, ok bool) { return uint64(*flagSeed), *flagSeed >= 0 }

// Result is what one schedule gives the runner.
type Result[S any] struct {
	Violations []Violation
	// Stats are the schedule's counts: a struct of int fields, summed over
	// the schedules.
	Stats S
	// Steps is the number of events run; Trace the trace (when asked for).
	Steps int
	Trace string
}

// Options shape a RunSeeds.
type Options[S any] struct {
	// Name prefixes every line logged ("sim", "spot sim").
	Name string
	// Schedules to run (0: Schedules()), from Seed0 on (0: -sim.seed0).
	Schedules int
	Seed0     uint64
	// Workers run schedules in parallel (0: GOMAXPROCS).
	Workers int
	// Replay is the command that replays a seed with its trace.
	Replay func(seed uint64) string
	// Report, if set, logs the summed counts and, by defect, the
	// violations marked Known, before any failure is reported.
	Report func(total S, known map[string]int)
}

// Summary is what RunSeeds found.
type Summary[S any] struct {
	Stats  S
	Steps  int
	Known  map[string]int
	Failed []uint64 // the seeds with a violation that is not Known, in order
}

// RunSeeds runs schedules seed by seed over the workers, run(seed, false)
// giving each one's result, and fails t if any has a violation not marked
// Known. For up to six distinct first invariants broken, it runs the
// failing seed again with the trace on (run(seed, true)) and reports its
// violations, its replay command and the end of its trace; then it lists
// failing seeds (env SIM_LIST of them, 30 by default).
func RunSeeds[S any](t testing.TB, o Options[S], run func(seed uint64, tracing bool) Result[S]) Summary[S] {
	t.Helper()
	n, seed0, workers := o.Schedules, o.Seed0, o.Workers
	if n <= 0 {
		n = Schedules()
	}
	if seed0 == 0 {
		seed0 = *flagSeed0
	}
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	type failure struct {
		seed uint64
		vs   []Violation
	}
	start := time.Now()
	var (
		mu     sync.Mutex
		sum    = Summary[S]{Known: map[string]int{}}
		failed []failure
		next   = seed0
		wg     sync.WaitGroup
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				if next >= seed0+uint64(n) {
					mu.Unlock()
					return
				}
				seed := next
				next++
				mu.Unlock()
				r := run(seed, false)
				mu.Lock()
				AddCounts(&sum.Stats, r.Stats)
				sum.Steps += r.Steps
				for _, v := range r.Violations {
					if v.Known != "" {
						sum.Known[v.Known]++
					}
				}
				if u := Unknown(r.Violations); len(u) > 0 {
					failed = append(failed, failure{seed, u})
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	t.Logf("%s: %d random schedules (seeds %d..%d) in %s (%.0f/s, %d workers), %d steps", o.Name, n, seed0, seed0+uint64(n)-1,
		el.Round(time.Millisecond), float64(n)/el.Seconds(), workers, sum.Steps)
	if o.Report != nil {
		o.Report(sum.Stats, sum.Known)
	}
	if len(failed) == 0 {
		return sum
	}
	slices.SortFunc(failed, func(a, b failure) int { return cmp.Compare(a.seed, b.seed) })
	byInv := map[string]int{}
	for _, f := range failed {
		sum.Failed = append(sum.Failed, f.seed)
		byInv[f.vs[0].Invariant]++
	}
	t.Errorf("%s: %d of %d schedules broke an invariant (first violation by invariant: %v)", o.Name, len(failed), n, byInv)
	shown := map[string]bool{}
	for _, f := range failed {
		if shown[f.vs[0].Invariant] || len(shown) >= 6 {
			continue
		}
		shown[f.vs[0].Invariant] = true
		var b strings.Builder
		fmt.Fprintf(&b, "seed %d — replay: %s\n", f.seed, o.Replay(f.seed))
		for _, v := range f.vs {
			fmt.Fprintf(&b, "  %s\n", v)
		}
		b.WriteString(Tail(run(f.seed, true).Trace, 60))
		t.Error(b.String())
	}
	for _, f := range failed[:min(len(failed), EnvInt("SIM_LIST", 30))] {
		t.Logf("failing seed %d: %s (%s)", f.seed, f.vs[0], o.Replay(f.seed))
	}
	return sum
}

// AddCounts adds each int field of src to dst's (S is a struct of counts;
// other fields are left alone).
func AddCounts[S any](dst *S, src S) {
	d, s := reflect.ValueOf(dst).Elem(), reflect.ValueOf(src)
	if d.Kind() != reflect.Struct {
		return
	}
	for i := range d.NumField() {
		if f := d.Field(i); f.Kind() == reflect.Int && f.CanSet() {
			f.SetInt(f.Int() + s.Field(i).Int())
		}
	}
}

// Tail returns the last n lines of a trace, saying how many it left out.
func Tail(trace string, n int) string {
	lines := strings.Split(trace, "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("… (%d earlier lines; the replay prints all)", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

// World is what the test helpers need of a simulation's World: one
// schedule, run once.
type World[S any] interface {
	SetTracing(on bool)
	// Run runs the schedule to its end and returns its violations,
	// classified.
	Run() []Violation
	Trace() string
	TraceLines() int
	Steps() int
	// Stats are the schedule's counts (see Result.Stats).
	Stats() S
}

// RunWorld runs w with the trace on or off and gives the runner its
// result.
func RunWorld[S any](w World[S], tracing bool) Result[S] {
	w.SetTracing(tracing)
	vs := w.Run()
	return Result[S]{Violations: vs, Stats: w.Stats(), Steps: w.Steps(), Trace: w.Trace()}
}

// Replay runs the random schedule of -sim.seed (random builds it) with
// its trace and prints the trace, a line summary writes from its counts,
// and its violations; it fails t on a violation not marked Known. Without
// -sim.seed it skips, naming how to pass one (the make command).
func Replay[S any](t *testing.T, how string, random func(seed uint64) World[S], summary func(S) string) {
	seed, ok := ReplaySeed()
	if !ok {
		t.Skipf("replay: pass -sim.seed=N (%s)", how)
	}
	w := random(seed)
	w.SetTracing(true)
	vs := w.Run()
	fmt.Println(w.Trace())
	fmt.Printf("\nseed %d: %s\n", seed, summary(w.Stats()))
	for _, v := range vs {
		fmt.Println("VIOLATION", v)
	}
	if len(Unknown(vs)) > 0 {
		t.Fail()
	}
}

// CheckSameSeedSameTrace fails unless each seed's schedule, run twice,
// traces the same lines, and enough of them to mean anything: a seed
// replays step for step.
func CheckSameSeedSameTrace[S any](t testing.TB, random func(seed uint64) World[S], seeds ...uint64) {
	t.Helper()
	for _, seed := range seeds {
		a, b := random(seed), random(seed)
		a.SetTracing(true)
		b.SetTracing(true)
		a.Run()
		b.Run()
		if a.Trace() != b.Trace() {
			t.Errorf("seed %d: two runs differ", seed)
			return
		}
		if a.TraceLines() < 50 {
			t.Errorf("seed %d: a trace of %d lines is too short to mean anything", seed, a.TraceLines())
			return
		}
	}
}
