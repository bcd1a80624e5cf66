package sim

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

var (
	flagSchedules = flag.Int("sim.schedules", envInt("SIM_SCHEDULES", 2000), "random schedules TestRandomSchedules runs (env SIM_SCHEDULES)")
	flagSeed0     = flag.Uint64("sim.seed0", uint64(envInt("SIM_SEED0", 1)), "first seed of TestRandomSchedules (env SIM_SEED0)")
	flagSeed      = flag.Int64("sim.seed", -1, "TestReplay: the seed to replay with its trace (make sim SEED=n)")
	flagSessions  = flag.Bool("sim.sessions", false, "TestReplay: replay a schedule of TestRandomSchedulesWithSessions (make sim SEED=n SESSIONS=1)")
)

// replay is the command that replays a random schedule.
func replay(seed uint64, sessions bool) string {
	if sessions {
		return fmt.Sprintf("make sim SEED=%d SESSIONS=1", seed)
	}
	return fmt.Sprintf("make sim SEED=%d", seed)
}

// SessionsConfig is DefaultConfig with every object bound to a client's
// Session: a seal timeout scaled like the hand-off's timings (3 s →
// 1.5 s) and a hold limit small enough to be reached.
func SessionsConfig() Config {
	c := DefaultConfig()
	c.Sessions, c.SessionSealTimeout, c.SessionHoldLimit = true, 1500*time.Millisecond, 4
	return c
}

// tail returns the last n lines of a trace.
func tail(trace string, n int) string {
	lines := strings.Split(trace, "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("… (%d earlier lines; the replay prints all)", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

type result struct {
	seed  uint64
	vs    []Violation
	stats Stats
}

// TestRandomSchedules runs -sim.schedules random schedules (seeds
// -sim.seed0 on) and fails on any violation that is not an instance of a
// known defect of the handoff in the tree, printing each failing seed, the
// command that replays it and the end of its trace.
func TestRandomSchedules(t *testing.T) { runRandom(t, DefaultConfig()) }

// TestRandomSchedulesWithSessions runs the random schedules with every
// object bound to a client's Session (session.go): a quarter as many, the
// same invariants, and nothing left held or sealed at a Session owner.
func TestRandomSchedulesWithSessions(t *testing.T) {
	st := runRandomN(t, SessionsConfig(), max(1, *flagSchedules/4))
	if st.Messages > 0 && st.SessionRefused == 0 && st.SessionsClosed == 0 && *flagSchedules >= 400 {
		t.Errorf("sim: no Session owner ever refused or closed: the hold limit and the seal timeout went unexercised")
	}
}

func runRandom(t *testing.T, cfg Config) Stats { return runRandomN(t, cfg, *flagSchedules) }

func runRandomN(t *testing.T, cfg Config, n int) Stats {
	seed0 := *flagSeed0
	workers := runtime.GOMAXPROCS(0)
	start := time.Now()
	var (
		mu     sync.Mutex
		total  Stats
		failed []result
		known  = map[string]int{}
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
				w := Random(cfg, seed)
				vs := w.Run()
				st := w.Stats()
				mu.Lock()
				add(&total, st)
				for _, v := range vs {
					if v.Known != "" {
						known[v.Known]++
					}
				}
				if u := Unknown(vs); len(u) > 0 {
					failed = append(failed, result{seed: seed, vs: u, stats: st})
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	t.Logf("sim: %d random schedules (seeds %d..%d) in %s (%.0f/s, %d workers), %d steps", n, seed0, seed0+uint64(n)-1, el.Round(time.Millisecond),
		float64(n)/el.Seconds(), workers, total.Steps)
	t.Logf("sim: moves %d: committed %d, source serving again %d (fence-outs %d, reinstated after the cutover %d), cutover fallbacks %d",
		total.Moves, total.Committed, total.SourceServesAgain+total.Reinstated, total.FencedOut, total.Reinstated, total.Fallbacks)
	t.Logf("sim: messages %d: handled %d, failed loudly %d, not accepted %d; expected losses: crash %d, ended lifecycle %d; Message Follow lost on a cut link %d",
		total.Messages, total.Handled, total.FailedLoud, total.Unaccepted, total.LostCrash, total.LostEnded, total.LostInTransitFollow)
	t.Logf("sim: faults: crashes %d, stops %d, lease ends %d, link cuts %d, store outages %d, indeterminate CAS %d",
		total.Crashes, total.Stops, total.LeaseEnds, total.Cuts, total.StoreOutages, total.IndeterminateCAS)
	if cfg.Sessions {
		t.Logf("sim: Sessions: client messages refused by their Session owner %d, Sessions closed by the seal timeout %d",
			total.SessionRefused, total.SessionsClosed)
	}
	for k, c := range known {
		t.Logf("sim: OPEN DEFECT %q: %d violations (counted here; TestOpenDefects fails while it is open)", k, c)
	}
	if len(failed) == 0 {
		return total
	}
	byInv := map[string]int{}
	for _, f := range failed {
		byInv[f.vs[0].Invariant]++
	}
	t.Errorf("sim: %d of %d schedules broke an invariant (first violation by invariant: %v)", len(failed), n, byInv)
	shown := map[string]bool{}
	for _, f := range failed {
		if shown[f.vs[0].Invariant] && len(shown) < 6 {
			continue
		}
		if len(shown) >= 6 {
			break
		}
		shown[f.vs[0].Invariant] = true
		w := Random(cfg, f.seed)
		w.SetTracing(true)
		w.Run()
		var b strings.Builder
		fmt.Fprintf(&b, "seed %d — replay: %s\n", f.seed, replay(f.seed, cfg.Sessions))
		for _, v := range f.vs {
			fmt.Fprintf(&b, "  %s\n", v)
		}
		b.WriteString(tail(w.Trace(), 60))
		t.Error(b.String())
	}
	for _, f := range failed[:min(len(failed), envInt("SIM_LIST", 30))] {
		t.Logf("failing seed %d: %s (%s)", f.seed, f.vs[0], replay(f.seed, cfg.Sessions))
	}
	return total
}

func add(total *Stats, s Stats) {
	total.Steps += s.Steps
	total.Moves += s.Moves
	total.Committed += s.Committed
	total.SourceServesAgain += s.SourceServesAgain
	total.FencedOut += s.FencedOut
	total.Reinstated += s.Reinstated
	total.Messages += s.Messages
	total.Handled += s.Handled
	total.FailedLoud += s.FailedLoud
	total.Unaccepted += s.Unaccepted
	total.LostCrash += s.LostCrash
	total.LostEnded += s.LostEnded
	total.LostInTransitFollow += s.LostInTransitFollow
	total.Crashes += s.Crashes
	total.Stops += s.Stops
	total.LeaseEnds += s.LeaseEnds
	total.Cuts += s.Cuts
	total.StoreOutages += s.StoreOutages
	total.Fallbacks += s.Fallbacks
	total.IndeterminateCAS += s.IndeterminateCAS
	total.SessionRefused += s.SessionRefused
	total.SessionsClosed += s.SessionsClosed
}

// TestReplay replays one random schedule with its trace: make sim SEED=n.
func TestReplay(t *testing.T) {
	if *flagSeed < 0 {
		t.Skip("replay: pass -sim.seed=N (make sim SEED=N)")
	}
	seed := uint64(*flagSeed)
	cfg := DefaultConfig()
	if *flagSessions {
		cfg = SessionsConfig()
	}
	w := Random(cfg, seed)
	w.SetTracing(true)
	vs := w.Run()
	fmt.Println(w.Trace())
	st := w.Stats()
	fmt.Printf("\nseed %d: %d steps, %d moves (%d committed, %d fenced out, %d reinstated), %d messages (%d handled, %d failed loudly, %d lost with a crashed node)\n",
		seed, st.Steps, st.Moves, st.Committed, st.FencedOut, st.Reinstated, st.Messages, st.Handled, st.FailedLoud, st.LostCrash)
	for _, v := range vs {
		fmt.Println("VIOLATION", v)
	}
	if len(Unknown(vs)) > 0 {
		t.Fail()
	}
}

// The same seed gives the same schedule, step for step.
func TestSameSeedSameTrace(t *testing.T) {
	for _, seed := range []uint64{3, 17, 4242} {
		a, b := Random(DefaultConfig(), seed), Random(DefaultConfig(), seed)
		a.SetTracing(true)
		b.SetTracing(true)
		a.Run()
		b.Run()
		if a.Trace() != b.Trace() {
			t.Fatalf("seed %d: two runs differ", seed)
		}
		if len(a.trace) < 50 {
			t.Fatalf("seed %d: a trace of %d lines is too short to mean anything", seed, len(a.trace))
		}
	}
}
