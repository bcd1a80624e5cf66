package envelope

import (
	"encoding/binary"
	"fmt"
)

// Decode parses a relocation-envelope-v1 stream (docs/PROTOCOL.md §5.6). It is
// strict: a truncated stream, trailing bytes, a presence byte other than 0
// or 1, a length or count that cannot fit in the remaining bytes, and every
// broken rule of the package comment return an error wrapping ErrMalformed.
// Counts and lengths are checked against the remaining input before
// anything is allocated, and Decode never panics. Returned byte slices are
// copies and never alias b; empty vectors and bytes decode as nil.
func Decode(b []byte) (*Envelope, error) { return decode(b, false) }

// DecodeOwned is Decode for a caller that hands b over: the returned byte
// slices alias b instead of copying it (a 16 MiB state is not copied
// again), so b must not be changed afterwards.
func DecodeOwned(b []byte) (*Envelope, error) { return decode(b, true) }

func decode(b []byte, alias bool) (*Envelope, error) {
	r := reader{b: b, alias: alias}
	e := &Envelope{}
	r.envelope(e)
	if r.err == nil && r.off != len(b) {
		r.fail("", "%d trailing bytes after the last field", len(b)-r.off)
	}
	if r.err != nil {
		return nil, r.err
	}
	if v := validate(e); v != nil {
		return nil, v.wrap(ErrMalformed)
	}
	return e, nil
}

// reader consumes the stream; the first error sticks and turns every later
// read into a zero-value no-op, so the parsing code reads straight through.
type reader struct {
	b     []byte
	off   int
	err   error
	path  fieldPath
	alias bool // byte fields alias b (DecodeOwned)
}

func (r *reader) fail(leaf, format string, args ...any) {
	if r.err != nil {
		return
	}
	where := "stream"
	if leaf != "" || len(r.path) > 0 {
		where = r.path.join(leaf)
	}
	r.err = fmt.Errorf("%w: %s at offset %d: %s", ErrMalformed, where, r.off, fmt.Sprintf(format, args...))
}

func (r *reader) remaining() int { return len(r.b) - r.off }

// take returns the next n bytes of the input (aliasing it), or nil after an
// error or when fewer than n bytes remain.
func (r *reader) take(leaf string, n uint64) []byte {
	if r.err != nil {
		return nil
	}
	if n > uint64(r.remaining()) {
		r.fail(leaf, "truncated: needs %d bytes, %d left", n, r.remaining())
		return nil
	}
	s := r.b[r.off : r.off+int(n)]
	r.off += int(n)
	return s
}

func (r *reader) u8(leaf string) uint8 {
	if s := r.take(leaf, 1); s != nil {
		return s[0]
	}
	return 0
}

func (r *reader) u16(leaf string) uint16 {
	if s := r.take(leaf, 2); s != nil {
		return binary.BigEndian.Uint16(s)
	}
	return 0
}

func (r *reader) u32(leaf string) uint32 {
	if s := r.take(leaf, 4); s != nil {
		return binary.BigEndian.Uint32(s)
	}
	return 0
}

func (r *reader) u64(leaf string) uint64 {
	if s := r.take(leaf, 8); s != nil {
		return binary.BigEndian.Uint64(s)
	}
	return 0
}

// text8 and text16 copy (string conversion); UTF-8 and emptiness are
// checked by validate after the structure has been read.
func (r *reader) text8(leaf string) string {
	return string(r.take(leaf, uint64(r.u8(leaf))))
}

func (r *reader) text16(leaf string) string {
	return string(r.take(leaf, uint64(r.u16(leaf))))
}

func (r *reader) bytes32(leaf string) []byte {
	s := r.take(leaf, uint64(r.u32(leaf)))
	if len(s) == 0 {
		return nil
	}
	if r.alias {
		return s[:len(s):len(s)]
	}
	return append([]byte(nil), s...)
}

func (r *reader) present(leaf string) bool {
	v := r.u8(leaf)
	if v > 1 {
		r.fail(leaf, "presence byte 0x%02x, want 0x00 or 0x01", v)
	}
	return v == 1
}

// count reads a vector count and rejects it unless count elements of at
// least minSize bytes each fit in the remaining input.
func (r *reader) count(leaf string, minSize int) int {
	n := r.u32(leaf)
	if r.err != nil {
		return 0
	}
	if need := uint64(n) * uint64(minSize); need > uint64(r.remaining()) {
		r.fail(leaf, "count %d needs at least %d bytes, %d left", n, need, r.remaining())
		return 0
	}
	return int(n)
}

func (r *reader) enter(name string, idx int) { r.path.push(name, idx) }
func (r *reader) leave()                     { r.path.pop() }

func (r *reader) envelope(e *Envelope) {
	r.enter("relocation", -1)
	e.Relocation.RelocationID = r.u64("relocationId")
	e.Relocation.TargetAttemptGeneration = r.u64("targetAttemptGeneration")
	r.enter("coordinatorFence", -1)
	f := &e.Relocation.CoordinatorFence
	f.NodeRid = r.text8("nodeRid")
	f.NodeGeneration = r.u64("nodeGeneration")
	f.OwnerGeneration = r.u64("ownerGeneration")
	r.leave()
	r.leave()

	r.enter("object", -1)
	e.Object.Kind = r.u8("kind")
	e.Object.ID = r.text8("id")
	e.Object.ObjectGeneration = r.u64("objectGeneration")
	e.Object.StableType = r.text8("stableType")
	r.leave()

	e.ApplicationVersion = r.text8("applicationVersion")

	if n := r.count("applicationStates.count", minApplicationState); n > 0 {
		e.ApplicationStates = make([]ApplicationState, n)
		for i := range e.ApplicationStates {
			s := &e.ApplicationStates[i]
			r.enter("applicationStates", i)
			s.ParticipantID = r.u32("participantId")
			s.State = r.bytes32("state")
			r.leave()
		}
	}

	if n := r.count("savedWork.count", minSavedWork); n > 0 {
		e.SavedWork = make([]SavedWork, n)
		for i := range e.SavedWork {
			s := &e.SavedWork[i]
			r.enter("savedWork", i)
			s.ParticipantID = r.u32("participantId")
			s.Order = r.u64("order")
			r.enter("record", -1)
			r.record(&s.Record)
			r.leave()
			r.leave()
		}
	}

	if n := r.count("timerRegistrations.count", minTimerRegistration); n > 0 {
		e.TimerRegistrations = make([]TimerRegistration, n)
		for i := range e.TimerRegistrations {
			t := &e.TimerRegistrations[i]
			r.enter("timerRegistrations", i)
			t.ParticipantID = r.u32("participantId")
			t.Name = r.text8("name")
			t.HandlerType = r.text16("handlerType")
			t.PeriodMillis = r.u64("periodMillis")
			t.OverrunPolicy = r.u8("overrunPolicy")
			t.CatchUpLimit = r.u32("catchUpLimit")
			t.UnhandledExceptionPolicy = r.u8("unhandledExceptionPolicy")
			t.CompletedDeliveryIndex = r.u64("completedDeliveryIndex")
			t.CompletedScheduleIndex = r.u64("completedScheduleIndex")
			t.NextScheduleUnixMillis = r.u64("nextScheduleUnixMillis")
			r.leave()
		}
	}

	if n := r.count("pendingTimerTicks.count", minPendingTimerTick); n > 0 {
		e.PendingTimerTicks = make([]PendingTimerTick, n)
		for i := range e.PendingTimerTicks {
			t := &e.PendingTimerTicks[i]
			r.enter("pendingTimerTicks", i)
			t.ParticipantID = r.u32("participantId")
			t.Order = r.u64("order")
			t.Name = r.text8("name")
			t.DeliveryIndex = r.u64("deliveryIndex")
			t.ScheduledIndex = r.u64("scheduledIndex")
			t.ScheduledUnixMillis = r.u64("scheduledUnixMillis")
			t.SkippedTicks = r.u32("skippedTicks")
			r.leave()
		}
	}
}

func (r *reader) record(rec *Record) {
	rec.Kind = RecordKind(r.u8("kind"))
	rec.Source = r.pid("source", "source.present")
	if n := r.count("metadata.count", minHeader); n > 0 {
		rec.Metadata = make([]Header, n)
		for j := range rec.Metadata {
			r.enter("metadata", j)
			rec.Metadata[j].Key = r.text16("key")
			rec.Metadata[j].Value = r.text16("value")
			r.leave()
		}
	}
	rec.OperationID = r.text8("operationId")
	rec.OperationKind = r.u8("operationKind")
	rec.ReplyRoute = r.pid("replyRoute", "replyRoute.present")
	rec.DeadlineUnixMillis = r.u64("deadlineUnixMillis")
	rec.MessageType = r.text16("messageType")
	rec.Body = r.bytes32("body")
}

func (r *reader) pid(leaf, presentLeaf string) *PID {
	if !r.present(presentLeaf) {
		return nil
	}
	r.enter(leaf, -1)
	p := &PID{Address: r.text16("address"), ID: r.text16("id")}
	r.leave()
	return p
}
