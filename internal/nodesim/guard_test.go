package nodesim

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roamactors/roam/internal/failpoint"
	"github.com/roamactors/roam/internal/placement"
)

// The tests here put a fixed defect back (internal/failpoint) and require
// the simulation to report the invariant it breaks: a checker that stops
// finding it fails them. They break rules the other tests of the package
// rely on, so none of them runs in parallel.

// recorder stands for the test in a world: it keeps what the world
// reports instead of failing, and a fatal report ends the world's
// goroutine as it would end the test's.
type recorder struct {
	testing.TB
	mu      sync.Mutex
	reports []string
}

func (r *recorder) add(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reports = append(r.reports, s)
}

func (r *recorder) Errorf(format string, args ...any) { r.add(fmt.Sprintf(format, args...)) }
func (r *recorder) Error(args ...any)                 { r.add(fmt.Sprint(args...)) }
func (r *recorder) Fatalf(format string, args ...any) {
	r.add(fmt.Sprintf(format, args...))
	runtime.Goexit()
}
func (r *recorder) Fatal(args ...any) { r.add(fmt.Sprint(args...)); runtime.Goexit() }
func (r *recorder) Failed() bool      { return len(r.all()) > 0 }

func (r *recorder) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.reports...)
}

// verdict runs the world of seed and cfg with the rule broken and
// requires a report that names want, returning it. What the world starts
// stops with the test.
func verdict(t *testing.T, rule *failpoint.Switch, seed uint64, cfg Config, want string) string {
	t.Helper()
	rule.Break(t)
	r := &recorder{TB: t}
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		New(r, seed, cfg).Run()
	}()
	<-ran // the world's own bounds end it
	for _, s := range r.all() {
		if strings.Contains(s, want) {
			t.Logf("with %q broken, seed %d reports:\n%s", rule.Name(), seed, firstLines(s, 12))
			return s
		}
	}
	t.Fatalf("with %q broken, seed %d reported no %q; it reported:\n%s", rule.Name(), seed, want, strings.Join(r.all(), "\n---\n"))
	return ""
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], "\n")
}

// Directors whose rounds tick on real time while their node runs on a
// logical clock fall behind any bound in logical time: the simulation
// reports that the elected director's passes did not cover the records
// in time. (The director's rounds, cooldowns and ledger times are on the
// node's clock; placement tests once waited 9.5 minutes for three passes
// of a director that ticked idle.) One page covers every record, and
// rounds come every half TTL: with its rounds on the node's clock a
// director completes two passes within two TTLs of the heal, on real time
// it needs two rounds of five seconds each.
func TestTheSimulationFindsDirectorRoundsOffTheNodeClock(t *testing.T) {
	ttl := 10 * time.Second
	s := verdict(t, failpoint.DirectorRoundsOnNodeClock, 1,
		Config{LeaseTTL: ttl, Faults: -1, Moves: -1, StopsInRejoin: -1, Drains: -1,
			Director: placement.Config{Period: ttl / 2, PageSize: 8}},
		"liveness:")
	if !strings.Contains(s, "the placement director completes two passes") {
		t.Fatalf("the liveness report does not name the director's passes:\n%s", firstLines(s, 12))
	}
}

// A Stop whose rejoin's claim runs under a context of its own (Stop does
// not cancel it) returns with the claim still waiting on the store: the
// simulation stops a node while its rejoin's claim is held and reports
// it. (TestBreakSecondRejoin made no progress for 8 minutes with one
// rejoin retrying and the other blocked; TestStopEndsTheRejoinsClaim is
// the unit test of the fix.)
func TestTheSimulationFindsAStopThatLeavesItsRejoin(t *testing.T) {
	verdict(t, failpoint.StopCancelsRejoin, 1,
		Config{Faults: -1, Moves: 2, Drains: -1, StopBound: 3 * time.Second},
		"rejoin's claim still waiting on the store")
}

// A move refused (a fenced target: "the target node's owner lease is not
// in force") or failed is an outcome the simulation accepts, but only
// with a typed error, its Spot answering again: with the error's class
// dropped, it reports the move's error as untyped. Every schedule moves a
// Spot to the node it stops in its rejoin once that node's lease has
// ended, so the refusal does not depend on how the drawn moves race.
func TestTheSimulationFindsAnUntypedRefusedMove(t *testing.T) {
	s := verdict(t, failpoint.RefusedMoveIsTyped, 1, Config{Faults: -1, Moves: -1, Drains: -1}, "\n  move spot-")
	if !strings.Contains(s, "owner lease is not") {
		t.Logf("no refusal by a fenced node among the untyped moves this run:\n%s", firstLines(s, 12))
	}
}
