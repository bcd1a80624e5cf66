package envelope

import (
	"fmt"
	"math"
	"unicode/utf8"
)

// violation is a broken rule: the field path (as in the golden fixtures)
// and what is wrong with it. Encode wraps it in ErrInvalid, Decode in
// ErrMalformed, so both sides enforce one set of rules.
type violation struct {
	path, msg string
}

func (v *violation) wrap(sentinel error) error {
	return fmt.Errorf("%w: %s: %s", sentinel, v.path, v.msg)
}

func text8Problem(s string, nonEmpty bool) string {
	switch {
	case len(s) > math.MaxUint8:
		return fmt.Sprintf("%d bytes, text8 holds at most 255", len(s))
	case nonEmpty && s == "":
		return "empty"
	case !utf8.ValidString(s):
		return "not valid UTF-8"
	}
	return ""
}

func text16Problem(s string, nonEmpty bool) string {
	switch {
	case len(s) > math.MaxUint16:
		return fmt.Sprintf("%d bytes, text16 holds at most 65535", len(s))
	case nonEmpty && s == "":
		return "empty"
	case !utf8.ValidString(s):
		return "not valid UTF-8"
	}
	return ""
}

func bytes32Problem(b []byte) string {
	if uint64(len(b)) > math.MaxUint32 {
		return fmt.Sprintf("%d bytes, bytes32 holds at most 4294967295", len(b))
	}
	return ""
}

func countProblem(n int) string {
	if uint64(n) > math.MaxUint32 {
		return fmt.Sprintf("%d elements, a vector holds at most 4294967295", n)
	}
	return ""
}

// checker collects the first violation; later checks are no-ops.
type checker struct {
	v *violation
}

// check records msg, if non-empty, against path.
func (c *checker) check(msg, path string) {
	if c.v == nil && msg != "" {
		c.v = &violation{path: path, msg: msg}
	}
}

// checkI is check with a path holding one element index; the path is only
// formatted on failure, so valid input costs no allocation.
func (c *checker) checkI(msg, format string, i int) {
	if c.v == nil && msg != "" {
		c.v = &violation{path: fmt.Sprintf(format, i), msg: msg}
	}
}

// checkIJ is checkI with two indexes.
func (c *checker) checkIJ(msg, format string, i, j int) {
	if c.v == nil && msg != "" {
		c.v = &violation{path: fmt.Sprintf(format, i, j), msg: msg}
	}
}

func participantProblem(p uint32) string {
	if p == 0 {
		return "participant 0, participants start at 1"
	}
	return ""
}

func orderProblem(later bool) string {
	if !later {
		return "not strictly after the previous element (unsorted or duplicate)"
	}
	return ""
}

// validate checks every rule of the package comment on e.
func validate(e *Envelope) *violation {
	if e == nil {
		return &violation{path: "envelope", msg: "nil"}
	}
	var c checker
	c.check(text8Problem(e.Relocation.CoordinatorFence.NodeRid, false), "relocation.coordinatorFence.nodeRid")
	c.check(text8Problem(e.Object.ID, true), "object.id")
	c.check(text8Problem(e.Object.StableType, true), "object.stableType")
	c.check(text8Problem(e.ApplicationVersion, false), "applicationVersion")

	c.check(countProblem(len(e.ApplicationStates)), "applicationStates.count")
	for i := range e.ApplicationStates {
		s := &e.ApplicationStates[i]
		c.checkI(participantProblem(s.ParticipantID), "applicationStates[%d].participantId", i)
		c.checkI(bytes32Problem(s.State), "applicationStates[%d].state", i)
		if i > 0 {
			c.checkI(orderProblem(e.ApplicationStates[i-1].ParticipantID < s.ParticipantID), "applicationStates[%d].participantId", i)
		}
	}

	c.check(countProblem(len(e.SavedWork)), "savedWork.count")
	for i := range e.SavedWork {
		w := &e.SavedWork[i]
		c.checkI(participantProblem(w.ParticipantID), "savedWork[%d].participantId", i)
		if i > 0 {
			p := &e.SavedWork[i-1]
			later := p.ParticipantID < w.ParticipantID || (p.ParticipantID == w.ParticipantID && p.Order < w.Order)
			c.checkI(orderProblem(later), "savedWork[%d].order", i)
		}
		c.record(&w.Record, i)
	}

	c.check(countProblem(len(e.TimerRegistrations)), "timerRegistrations.count")
	for i := range e.TimerRegistrations {
		t := &e.TimerRegistrations[i]
		c.checkI(participantProblem(t.ParticipantID), "timerRegistrations[%d].participantId", i)
		c.checkI(text8Problem(t.Name, true), "timerRegistrations[%d].name", i)
		c.checkI(text16Problem(t.HandlerType, false), "timerRegistrations[%d].handlerType", i)
		if i > 0 {
			p := &e.TimerRegistrations[i-1]
			later := p.ParticipantID < t.ParticipantID || (p.ParticipantID == t.ParticipantID && p.Name < t.Name)
			c.checkI(orderProblem(later), "timerRegistrations[%d].name", i)
		}
	}

	c.check(countProblem(len(e.PendingTimerTicks)), "pendingTimerTicks.count")
	for i := range e.PendingTimerTicks {
		t := &e.PendingTimerTicks[i]
		c.checkI(participantProblem(t.ParticipantID), "pendingTimerTicks[%d].participantId", i)
		c.checkI(text8Problem(t.Name, false), "pendingTimerTicks[%d].name", i)
		if i > 0 {
			p := &e.PendingTimerTicks[i-1]
			later := p.ParticipantID < t.ParticipantID || (p.ParticipantID == t.ParticipantID && p.Order < t.Order)
			c.checkI(orderProblem(later), "pendingTimerTicks[%d].order", i)
		}
	}
	return c.v
}

func (c *checker) record(r *Record, i int) {
	if r.Kind != RecordSend && r.Kind != RecordRequest {
		c.checkI(fmt.Sprintf("kind %d, want 1 (send) or 2 (request)", r.Kind), "savedWork[%d].record.kind", i)
	}
	c.pid(r.Source, i, "savedWork[%d].record.source.address", "savedWork[%d].record.source.id")
	c.checkI(countProblem(len(r.Metadata)), "savedWork[%d].record.metadata.count", i)
	for j := range r.Metadata {
		h := &r.Metadata[j]
		c.checkIJ(text16Problem(h.Key, false), "savedWork[%d].record.metadata[%d].key", i, j)
		c.checkIJ(text16Problem(h.Value, false), "savedWork[%d].record.metadata[%d].value", i, j)
		if j > 0 {
			c.checkIJ(orderProblem(r.Metadata[j-1].Key < h.Key), "savedWork[%d].record.metadata[%d].key", i, j)
		}
	}
	c.checkI(text8Problem(r.OperationID, false), "savedWork[%d].record.operationId", i)
	c.pid(r.ReplyRoute, i, "savedWork[%d].record.replyRoute.address", "savedWork[%d].record.replyRoute.id")
	c.checkI(text16Problem(r.MessageType, true), "savedWork[%d].record.messageType", i)
	c.checkI(bytes32Problem(r.Body), "savedWork[%d].record.body", i)
}

func (c *checker) pid(p *PID, i int, addressPath, idPath string) {
	if p == nil {
		return
	}
	c.checkI(text16Problem(p.Address, false), addressPath, i)
	c.checkI(text16Problem(p.ID, false), idPath, i)
}
