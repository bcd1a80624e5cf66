package simkit

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/roamactors/roam/internal/simscript"
)

// runScript runs text through cmds and returns the mismatches' errors and
// the script as -rewrite would write it.
func runScript(t *testing.T, cmds Commands, text string) (errs []string, rewritten string) {
	t.Helper()
	s, err := simscript.Parse("test.txt", text)
	if err != nil {
		t.Fatal(err)
	}
	ms, rewritten := s.Run(handler(cmds))
	for _, m := range ms {
		if m.Err != "" {
			errs = append(errs, m.Err)
		}
	}
	return errs, rewritten
}

// A script starts with world, has one, and uses only the table's
// commands; the others reach their handlers.
func TestScriptCommandTable(t *testing.T) {
	worlds, pings := 0, 0
	cmds := Commands{
		"world": func(*simscript.Cmd) string { worlds++; return "built" },
		"ping":  func(*simscript.Cmd) string { pings++; return "pong" },
	}
	for script, want := range map[string]string{
		"ping\n----\n":                             "no world yet: start the script with world",
		"world\n----\nbuilt\n\nworld\n----\n":      "one world per script",
		"world\n----\nbuilt\n\nbogus\n----\n":      `unknown command "bogus"`,
		"world\n----\nbuilt\n\nping\n----\npong\n": "",
	} {
		worlds, pings = 0, 0
		errs, _ := runScript(t, cmds, script)
		if want == "" && len(errs) > 0 || want != "" && !slices.Equal(errs, []string{want}) {
			t.Errorf("%q: errors %q, want %q", script, errs, want)
		}
		if worlds > 1 || pings > 0 && worlds != 1 {
			t.Errorf("%q: world ran %d times, ping %d", script, worlds, pings)
		}
	}
}

// A store-call fault skips, answers its count, stops at until, and keeps
// one log line for all it answered.
func TestCallFault(t *testing.T) {
	var f *CallFault
	var call, answer int
	cmds := Commands{"world": func(c *simscript.Cmd) string {
		f, call, answer = ParseCallFault(c, []string{"read", "cas"}, []string{"ok", "late"})
		return ""
	}}
	if errs, _ := runScript(t, cmds, "world cas late skip=1 count=2 until=50ms latency=3ms\n----\n"); len(errs) > 0 {
		t.Fatal(errs)
	}
	if call != 1 || answer != 1 || f.Skip != 1 || f.Left != 2 || f.Until != 50*time.Millisecond || f.Latency != 3*time.Millisecond {
		t.Fatalf("parsed call %d answer %d fault %+v", call, answer, *f)
	}
	var log ScriptLog
	var taken []bool
	for _, at := range []time.Duration{10, 20, 30, 40} {
		now := at * time.Millisecond
		if !f.Open(now) {
			taken = append(taken, false)
			continue
		}
		taken = append(taken, f.Take(&log, now, "n1 cas answered %s", "late"))
	}
	if want := []bool{false, true, true, false}; !slices.Equal(taken, want) {
		t.Errorf("answered %v, want %v (skip one, answer two)", taken, want)
	}
	if got, want := log.Report(nil), "  20.000ms  n1 cas answered late, 2 calls to 30.000ms"; got != want {
		t.Errorf("log %q, want %q", got, want)
	}
	if !f.Reached() || f.Answered() != 2 {
		t.Errorf("reached %v, answered %d", f.Reached(), f.Answered())
	}
	g := &CallFault{Left: -1, Until: 50 * time.Millisecond}
	if !g.Open(49*time.Millisecond) || g.Open(50*time.Millisecond) {
		t.Errorf("a fault with until=50ms must answer before 50ms and not from it")
	}
	if g.Reached() {
		t.Errorf("a fault no call reached counts as reached")
	}
	g.Desc = "fault read ok"
	if got, want := Unreached([]*CallFault{f, g}), []string{"fault read ok"}; !slices.Equal(got, want) {
		t.Errorf("unreached %q, want %q", got, want)
	}
	if got, want := log.Report([]string{"fault x"}), "  20.000ms  n1 cas answered late, 2 calls to 30.000ms\nnever: fault x"; got != want {
		t.Errorf("report %q, want %q", got, want)
	}
}

type RelayThenCutover struct{}
type Seal struct{}

func TestKebabNames(t *testing.T) {
	got := KebabNames([]any{RelayThenCutover{}, Seal{}})
	if want := []string{"relay-then-cutover", "seal"}; !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

// The trace command keeps what step keeps unless raw, then the lines with
// every word as a whole token.
func TestScriptTrace(t *testing.T) {
	trace := "a m1 x\nb m17 x\n\nc m1 y"
	step := func(l string) (string, bool) { return strings.ToUpper(l), !strings.HasPrefix(l, "c") }
	var got []string
	cmds := Commands{"world": func(*simscript.Cmd) string { return "" }, "trace": func(c *simscript.Cmd) string {
		got = append(got, ScriptTrace(c, trace, step))
		return ""
	}}
	if errs, _ := runScript(t, cmds, "world\n----\n\ntrace\n----\n\ntrace raw m1\n----\n\ntrace M1\n----\n"); len(errs) > 0 {
		t.Fatal(errs)
	}
	want := []string{"A M1 X\nB M17 X", "a m1 x\nc m1 y", "A M1 X"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestListViolations(t *testing.T) {
	if got := ListViolations(nil); got != "none" {
		t.Errorf("no violations: %q", got)
	}
	vs := []Violation{{At: time.Millisecond, Invariant: "a", Detail: "x"}, {Invariant: "b", Detail: "y", Known: "K"}}
	if got, want := ListViolations(vs), "1.000ms a: x\n0.000ms b: y [known: K]"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// A trigger fires once, at its effect, on a machine it matches; the ones
// that never fired are the run's never: lines.
func TestTriggers(t *testing.T) {
	var fired []string
	ts := Triggers[int]{
		{Desc: "seal on 2", Effect: "seal", Match: func(m int) bool { return m == 2 }, Fire: func(m int) { fired = append(fired, fmt.Sprint("a", m)) }},
		{Desc: "seal on any", Effect: "seal", Fire: func(m int) { fired = append(fired, fmt.Sprint("b", m)) }},
		{Desc: "relay", Effect: "relay-then-cutover", Fire: func(m int) { fired = append(fired, fmt.Sprint("c", m)) }},
	}
	ts.Effect(Seal{}, 1)
	ts.Effect(Seal{}, 2)
	ts.Effect(Seal{}, 2)
	if got, want := strings.Join(fired, " "), "b1 a2"; got != want {
		t.Errorf("fired %q, want %q", got, want)
	}
	if got, want := ts.Never(), []string{"relay"}; !slices.Equal(got, want) {
		t.Errorf("never %q, want %q", got, want)
	}
}

func TestChoiceArg(t *testing.T) {
	choices := map[string]int{"none": 0, "b": 2, "a": 1}
	var got []int
	cmds := Commands{"world": func(c *simscript.Cmd) string {
		got = append(got, ChoiceArg(c, "sabotage", "none", choices))
		return ""
	}}
	for _, tc := range []struct{ script, err string }{
		{"world\n----\n", ""},
		{"world sabotage=b\n----\n", ""},
		{"world sabotage=x\n----\n", "sabotage=x: not one of a, b, none"},
	} {
		if errs, _ := runScript(t, cmds, tc.script); tc.err == "" && len(errs) > 0 || tc.err != "" && !slices.Equal(errs, []string{tc.err}) {
			t.Errorf("%q: errors %q, want %q", tc.script, errs, tc.err)
		}
	}
	if !slices.Equal(got, []int{0, 2}) {
		t.Errorf("chose %v, want [0 2]", got)
	}
}

func TestWithoutTimers(t *testing.T) {
	got := WithoutTimers("StartTimer(restore) Seal StopTimer(seal) CommitOwner(1 settle=false)")
	if want := []string{"Seal", "CommitOwner(1", "settle=false)"}; !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := WithoutTimers("StartTimer(x)"); len(got) != 0 {
		t.Errorf("timers only: got %q, want none", got)
	}
}
