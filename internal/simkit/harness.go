package simkit

import (
	"fmt"
	"strings"
	"time"
)

// Harness is what a simulation's World embeds: its clock and event queue,
// its random source, its trace and the violations found. Not safe for
// concurrent use; run one World per goroutine.
type Harness struct {
	Sched
	Rand *Rand

	tracing    bool
	trace      []string
	violations []Violation
}

// NewHarness returns a harness at time 0 whose random source is seed on
// stream.
func NewHarness(seed, stream uint64) Harness { return Harness{Rand: NewRand(seed, stream)} }

// MaxSteps bounds one schedule: a livelock is a failure, not a hang.
const MaxSteps = 200000

// RunSchedule runs the schedule's events up to end with at most MaxSteps
// of them (see RunTo), then the end-state checks in order, and returns
// the violations found.
func (h *Harness) RunSchedule(end time.Duration, checks ...func()) []Violation {
	h.RunTo(end, MaxSteps)
	for _, check := range checks {
		check()
	}
	return h.violations
}

// MaxViolations stops a schedule: past it the first violations have long
// said what broke.
const MaxViolations = 20

// RunTo runs the schedule's events up to end (see Sched.Run), records a
// "livelock" violation if more than maxSteps ran, and moves the clock to
// end for the end-state checks.
func (h *Harness) RunTo(end time.Duration, maxSteps int) {
	if !h.Sched.Run(end, maxSteps, func() bool { return len(h.violations) >= MaxViolations }) {
		h.Violate("livelock", "more than %d steps before %s", maxSteps, end)
	}
	h.AdvanceTo(end)
}

// Tracing reports whether the trace is on. Hot paths check it before they
// format anything for Tracef.
func (h *Harness) Tracing() bool { return h.tracing }

// SetTracing turns the trace on or off; call before running.
func (h *Harness) SetTracing(on bool) { h.tracing = on }

// Tracef adds a line, stamped with the logical time, when tracing.
func (h *Harness) Tracef(format string, args ...any) {
	if !h.tracing {
		return
	}
	h.trace = append(h.trace, Millis(h.now)+"  "+fmt.Sprintf(format, args...))
}

// Trace returns the trace (empty unless tracing was on).
func (h *Harness) Trace() string { return strings.Join(h.trace, "\n") }

// TraceLines is the number of lines traced.
func (h *Harness) TraceLines() int { return len(h.trace) }

// Millis formats a logical time as the trace stamps it.
func Millis(d time.Duration) string {
	return fmt.Sprintf("%10.3fms", float64(d)/float64(time.Millisecond))
}

// Violation is one broken invariant.
type Violation struct {
	At        time.Duration
	Invariant string
	Detail    string
	// Obj names the object concerned ("" if none); Msg is the message's
	// number (0 if none). Known uses them to attribute a violation.
	Obj string
	Msg int
	// Known names the known defect this violation is an instance of
	// (empty: none); see Defects.
	Known string
}

func (v Violation) String() string {
	s := fmt.Sprintf("%.3fms %s: %s", float64(v.At)/float64(time.Millisecond), v.Invariant, v.Detail)
	if v.Known != "" {
		s += " [known: " + v.Known + "]"
	}
	return s
}

// Violate records a violation now, traces it and returns it for the
// caller to name its object and message (the pointer is valid until the
// next Violate).
func (h *Harness) Violate(invariant, format string, args ...any) *Violation {
	h.violations = append(h.violations, Violation{At: h.now, Invariant: invariant, Detail: fmt.Sprintf(format, args...)})
	v := &h.violations[len(h.violations)-1]
	h.Tracef("VIOLATION %s", *v)
	return v
}

// Violations returns the violations recorded. The slice is the harness's
// own: a simulation marks Known in it when it classifies them.
func (h *Harness) Violations() []Violation { return h.violations }

// Unknown returns the violations that are not instances of a known defect.
func Unknown(vs []Violation) []Violation {
	var out []Violation
	for _, v := range vs {
		if v.Known == "" {
			out = append(out, v)
		}
	}
	return out
}
