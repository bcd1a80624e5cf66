package simkit

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/roamactors/roam/internal/simscript"
)

// Commands is a scenario script environment's command table, by command
// name. "world" builds the script's one world; every other command needs
// it, so a script starts with world.
type Commands map[string]func(c *simscript.Cmd) string

// RunScripts runs every scenario script under dir, each with the command
// table env gives it, so that no state leaks from one script into the
// next. go test … -run TestScripts -rewrite writes the actual outputs
// into the scripts.
func RunScripts(t *testing.T, dir string, env func() Commands) {
	t.Helper()
	simscript.RunDir(t, dir, func(*testing.T) func(*simscript.Cmd) string { return handler(env()) })
}

// handler runs a script's commands from cmds, world first and once.
func handler(cmds Commands) func(*simscript.Cmd) string {
	world := false
	return func(c *simscript.Cmd) string {
		switch {
		case c.Name != "world" && !world:
			c.Fatalf("no world yet: start the script with world")
		case c.Name == "world" && world:
			c.Fatalf("one world per script")
		}
		h, ok := cmds[c.Name]
		if !ok {
			c.Fatalf("unknown command %q", c.Name)
		}
		out := h(c)
		// Set only once world returned: a world command the script got
		// wrong stops it before there is a world.
		world = world || c.Name == "world"
		return out
	}
}

// ScriptLog is what a script's own actions did while its world ran (a
// move started, a fault fired, a store call answered), which the run
// command prints.
type ScriptLog struct{ lines []string }

// Logf adds a line stamped with the logical time now.
func (l *ScriptLog) Logf(now time.Duration, format string, args ...any) {
	l.lines = append(l.lines, fmt.Sprintf("%10s  ", millis(now))+fmt.Sprintf(format, args...))
}

// Report is the run command's output: the log, then a "never:" line for
// each of the script's actions that never happened (never: their
// descriptions).
func (l *ScriptLog) Report(never []string) string {
	out := slices.Clone(l.lines)
	for _, d := range never {
		out = append(out, "never: "+d)
	}
	return strings.Join(out, "\n")
}

func millis(d time.Duration) string {
	return fmt.Sprintf("%.3fms", float64(d)/float64(time.Millisecond))
}

// CallFault is a script's fault on store calls: of the calls it matches,
// the first Left (-1: every one) after skipping Skip, before Until (0: no
// end), get the simulation's forced answer, Latency late. The simulation
// decides what a call must be to match (its kind, node, object); the
// fault counts the matches and keeps one log line for all it answered.
type CallFault struct {
	Desc           string
	Skip, Left     int
	Until, Latency time.Duration

	seen, answered int
	// logAt is the fault's line in the log, firstLine that line as first
	// written: later answers rewrite it with their count rather than
	// repeat it.
	logAt     int
	firstLine string
}

// ParseCallFault reads "fault <call> <answer> [skip=N] [count=1|all]
// [until=T] [latency=D]": the call is one of calls, the answer one of
// answers; it returns the fault and the indexes of the call and the
// answer. The command's other arguments are the simulation's to read.
func ParseCallFault(c *simscript.Cmd, calls, answers []string) (f *CallFault, call, answer int) {
	words := c.Words()
	if len(words) != 2 {
		c.Fatalf("fault wants a store call and an answer")
	}
	f = &CallFault{Desc: c.Line, Skip: c.Int("skip", 0), Left: c.Count(1), Until: c.Dur("until", 0), Latency: c.Dur("latency", 0)}
	if call = slices.Index(calls, words[0]); call < 0 {
		c.Fatalf("no store call %q (one of %s)", words[0], strings.Join(calls, ", "))
	}
	if answer = slices.Index(answers, words[1]); answer < 0 {
		c.Fatalf("no answer %q (one of %s)", words[1], strings.Join(answers, ", "))
	}
	return f, call, answer
}

// Open reports whether the fault may still answer a call at now.
func (f *CallFault) Open(now time.Duration) bool {
	return f.Left != 0 && (f.Until <= 0 || now < f.Until)
}

// Take counts a matching call and reports whether the fault answers it
// (it is past the skipped ones). The first answer logs the line format
// gives; later ones add their count and time to it.
func (f *CallFault) Take(log *ScriptLog, now time.Duration, format string, args ...any) bool {
	f.seen++
	if f.seen <= f.Skip {
		return false
	}
	if f.Left > 0 {
		f.Left--
	}
	f.answered++
	if f.answered == 1 {
		log.Logf(now, format, args...)
		f.logAt, f.firstLine = len(log.lines)-1, log.lines[len(log.lines)-1]
	} else {
		log.lines[f.logAt] = fmt.Sprintf("%s, %d calls to %s", f.firstLine, f.answered, millis(now))
	}
	return true
}

// Unreached returns the descriptions of the faults that no call got past
// the skipped ones of: steps of the script that never happened.
func Unreached[F interface{ Fault() *CallFault }](fs []F) []string {
	var out []string
	for _, f := range fs {
		if cf := f.Fault(); !cf.Reached() {
			out = append(out, cf.Desc)
		}
	}
	return out
}

// Fault returns f: a simulation's fault that embeds a CallFault is one
// for Unreached.
func (f *CallFault) Fault() *CallFault { return f }

// Answered is the number of calls the fault answered.
func (f *CallFault) Answered() int { return f.answered }

// Reached reports whether a call got past the skipped ones: a fault never
// reached is a step of the script that never happened.
func (f *CallFault) Reached() bool { return f.seen > f.Skip }

// KebabNames are the dynamic type names of vs in kebab case
// (RelayThenCutover is relay-then-cutover): how a script names the
// effects of a machine.
func KebabNames[V any](vs []V) []string {
	var out []string
	for _, v := range vs {
		out = append(out, KebabName(v))
	}
	return out
}

// KebabName is v's dynamic type name in kebab case.
func KebabName(v any) string {
	var b strings.Builder
	for i, r := range reflect.TypeOf(v).Name() {
		if r >= 'A' && r <= 'Z' {
			if i > 0 {
				b.WriteByte('-')
			}
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Trigger is a script's action set off the first time a machine is
// about to run an effect (on=<effect>). C is what the simulation knows of
// that machine: Match (nil: any machine) filters on it, Fire acts on it.
type Trigger[C any] struct {
	// Desc is what the run command prints if it never fired.
	Desc   string
	Effect string // the effect's kebab name (EffectArg)
	Match  func(C) bool
	Fire   func(C)
	fired  bool
}

// Triggers are a script's triggers, in the order it set them.
type Triggers[C any] []*Trigger[C]

// Effect fires, in order, every trigger not fired yet on eff that
// matches c: a machine of c is about to run eff.
func (ts Triggers[C]) Effect(eff any, c C) {
	if len(ts) == 0 {
		return // no name to work out on a script without triggers
	}
	name := KebabName(eff)
	for _, t := range ts {
		if t.fired || t.Effect != name || (t.Match != nil && !t.Match(c)) {
			continue
		}
		t.fired = true
		t.Fire(c)
	}
}

// Never returns the descriptions of the triggers that never fired.
func (ts Triggers[C]) Never() []string {
	var out []string
	for _, t := range ts {
		if !t.fired {
			out = append(out, t.Desc)
		}
	}
	return out
}

// ChoiceArg is the value choices has for key= (def if the command has no
// key=); a value it does not have stops the script, naming those it has.
func ChoiceArg[V any](c *simscript.Cmd, key, def string, choices map[string]V) V {
	v, ok := choices[c.Val(key, def)]
	if !ok {
		c.Fatalf("%s=%s: not one of %s", key, c.Val(key, def), strings.Join(slices.Sorted(maps.Keys(choices)), ", "))
	}
	return v
}

// EffectArg is the effect a fault is set off at (on=; "" if at a time),
// one of names.
func EffectArg(c *simscript.Cmd, names []string) string {
	on := c.Val("on", "")
	if on != "" && !slices.Contains(names, on) {
		c.Fatalf("on=%s: no such effect (one of %s)", on, strings.Join(names, ", "))
	}
	return on
}

// ScriptTrace is the trace command's output: "trace [raw] [word …]".
// Without raw, only the lines of trace that step keeps, as step rewrites
// them (a simulation's protocol steps); words keep only the lines that
// contain each of them as a whole token (m1 does not match m17).
func ScriptTrace(c *simscript.Cmd, trace string, step func(line string) (string, bool)) string {
	raw := c.Has("raw")
	words := slices.DeleteFunc(c.Words(), func(s string) bool { return s == "raw" })
	var out []string
	for _, l := range strings.Split(trace, "\n") {
		if l == "" {
			continue
		}
		if !raw {
			var ok bool
			if l, ok = step(l); !ok {
				continue
			}
		}
		if simscript.HasTokens(l, words) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// WithoutTimers returns the words of a machine step's effects as its
// trace line lists them (separated by spaces) but the timers' starts and
// stops: a script's protocol trace leaves timers out.
func WithoutTimers(effects string) []string {
	var out []string
	for _, e := range strings.Fields(effects) {
		if !strings.HasPrefix(e, "StartTimer(") && !strings.HasPrefix(e, "StopTimer(") {
			out = append(out, e)
		}
	}
	return out
}

// ListViolations is the violations command's output: one violation a
// line, or "none".
func ListViolations(vs []Violation) string {
	if len(vs) == 0 {
		return "none"
	}
	var out []string
	for _, v := range vs {
		out = append(out, v.String())
	}
	return strings.Join(out, "\n")
}
