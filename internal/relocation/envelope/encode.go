package envelope

import (
	"encoding/binary"
	"fmt"
	"strconv"
)

// span describes one primitive the encoder wrote: its byte range, its field
// path and a readable value. The golden fixtures' .md files are generated
// from spans, so the description walks the very code that writes bytes.
type span struct {
	offset, length int
	path, value    string
}

// Encode validates e against every rule of relocation-envelope-v1 and
// returns its canonical stream (docs/PROTOCOL.md §5.6). A broken rule returns an
// error wrapping ErrInvalid and no bytes; Encode never produces a stream
// Decode would reject.
func Encode(e *Envelope) ([]byte, error) {
	return encode(e, nil)
}

func encode(e *Envelope, trace func(span)) ([]byte, error) {
	if v := validate(e); v != nil {
		return nil, v.wrap(ErrInvalid)
	}
	w := writer{buf: make([]byte, 0, encodedSize(e)), trace: trace}
	w.envelope(e)
	return w.buf, nil
}

// aliasMin is the smallest byte field EncodeStream leaves in place.
const aliasMin = 64 << 10

// EncodeStream is Encode for a payload about to be sent: the same stream,
// but byte fields of 64 KiB or more (a large application state) are not
// copied into it — the Stream's pieces are e's slices themselves, so the
// caller must not change them while the Stream is in use.
func EncodeStream(e *Envelope) (Stream, error) {
	if v := validate(e); v != nil {
		return Stream{}, v.wrap(ErrInvalid)
	}
	size := encodedSize(e)
	for i := range e.ApplicationStates {
		if n := len(e.ApplicationStates[i].State); n >= aliasMin {
			size -= n
		}
	}
	for i := range e.SavedWork {
		if n := len(e.SavedWork[i].Record.Body); n >= aliasMin {
			size -= n
		}
	}
	w := writer{buf: make([]byte, 0, size), alias: true}
	w.envelope(e)
	w.pieces = append(w.pieces, w.buf[w.mark:])
	st := Stream{pieces: w.pieces[:0]}
	for _, p := range w.pieces {
		if len(p) > 0 {
			st.pieces = append(st.pieces, p)
			st.n += len(p)
		}
	}
	return st, nil
}

// writer appends primitives; values are already validated, so it never
// fails. With trace set it reports a span per primitive. With alias set,
// large byte fields become pieces of their own (pieces, up to mark in
// buf, are the stream so far).
type writer struct {
	buf    []byte
	trace  func(span)
	path   fieldPath
	alias  bool
	pieces [][]byte
	mark   int
}

func (w *writer) enter(name string, idx int) {
	if w.trace != nil {
		w.path.push(name, idx)
	}
}

func (w *writer) leave() {
	if w.trace != nil {
		w.path.pop()
	}
}

func (w *writer) emit(start int, leaf, value string) {
	w.trace(span{offset: start, length: len(w.buf) - start, path: w.path.join(leaf), value: value})
}

// uint appends v as a big-endian integer of width bytes. The field path is
// leaf+suffix, concatenated only when tracing.
func (w *writer) uint(leaf, suffix string, width int, v uint64) {
	start := len(w.buf)
	switch width {
	case 1:
		w.buf = append(w.buf, uint8(v))
	case 2:
		w.buf = binary.BigEndian.AppendUint16(w.buf, uint16(v))
	case 4:
		w.buf = binary.BigEndian.AppendUint32(w.buf, uint32(v))
	default:
		w.buf = binary.BigEndian.AppendUint64(w.buf, v)
	}
	if w.trace != nil {
		w.emit(start, leaf+suffix, fmt.Sprintf("0x%0*x (%d)", width*2, v, v))
	}
}

func (w *writer) u8(leaf string, v uint8)   { w.uint(leaf, "", 1, uint64(v)) }
func (w *writer) u32(leaf string, v uint32) { w.uint(leaf, "", 4, uint64(v)) }
func (w *writer) u64(leaf string, v uint64) { w.uint(leaf, "", 8, v) }

func (w *writer) text8(leaf, s string) {
	w.uint(leaf, ".length", 1, uint64(len(s)))
	w.text(leaf, s)
}

func (w *writer) text16(leaf, s string) {
	w.uint(leaf, ".length", 2, uint64(len(s)))
	w.text(leaf, s)
}

func (w *writer) text(leaf, s string) {
	start := len(w.buf)
	w.buf = append(w.buf, s...)
	if w.trace != nil {
		w.emit(start, leaf, strconv.Quote(s))
	}
}

func (w *writer) bytes32(leaf string, b []byte) {
	w.uint(leaf, ".length", 4, uint64(len(b)))
	if w.alias && len(b) >= aliasMin {
		w.pieces = append(w.pieces, w.buf[w.mark:len(w.buf):len(w.buf)], b)
		w.mark = len(w.buf)
		return
	}
	start := len(w.buf)
	w.buf = append(w.buf, b...)
	if w.trace != nil {
		value := "(empty)"
		if len(b) > 0 {
			value = fmt.Sprintf("0x%x", b)
		}
		w.emit(start, leaf, value)
	}
}

func (w *writer) count(leaf string, n int) {
	w.uint(leaf, ".count", 4, uint64(n))
}

func (w *writer) presence(leaf string, present bool) {
	start := len(w.buf)
	var v uint8
	value := "0x00 (absent)"
	if present {
		v, value = 1, "0x01 (present)"
	}
	w.buf = append(w.buf, v)
	if w.trace != nil {
		w.emit(start, leaf+".present", value)
	}
}

func (w *writer) envelope(e *Envelope) {
	w.enter("relocation", -1)
	w.u64("relocationId", e.Relocation.RelocationID)
	w.u64("targetAttemptGeneration", e.Relocation.TargetAttemptGeneration)
	w.enter("coordinatorFence", -1)
	f := &e.Relocation.CoordinatorFence
	w.text8("nodeRid", f.NodeRid)
	w.u64("nodeGeneration", f.NodeGeneration)
	w.u64("ownerGeneration", f.OwnerGeneration)
	w.leave()
	w.leave()

	w.enter("object", -1)
	w.u8("kind", e.Object.Kind)
	w.text8("id", e.Object.ID)
	w.u64("objectGeneration", e.Object.ObjectGeneration)
	w.text8("stableType", e.Object.StableType)
	w.leave()

	w.text8("applicationVersion", e.ApplicationVersion)

	w.count("applicationStates", len(e.ApplicationStates))
	for i := range e.ApplicationStates {
		s := &e.ApplicationStates[i]
		w.enter("applicationStates", i)
		w.u32("participantId", s.ParticipantID)
		w.bytes32("state", s.State)
		w.leave()
	}

	w.count("savedWork", len(e.SavedWork))
	for i := range e.SavedWork {
		s := &e.SavedWork[i]
		w.enter("savedWork", i)
		w.u32("participantId", s.ParticipantID)
		w.u64("order", s.Order)
		w.enter("record", -1)
		w.record(&s.Record)
		w.leave()
		w.leave()
	}

	w.count("timerRegistrations", len(e.TimerRegistrations))
	for i := range e.TimerRegistrations {
		t := &e.TimerRegistrations[i]
		w.enter("timerRegistrations", i)
		w.u32("participantId", t.ParticipantID)
		w.text8("name", t.Name)
		w.text16("handlerType", t.HandlerType)
		w.u64("periodMillis", t.PeriodMillis)
		w.u8("overrunPolicy", t.OverrunPolicy)
		w.u32("catchUpLimit", t.CatchUpLimit)
		w.u8("unhandledExceptionPolicy", t.UnhandledExceptionPolicy)
		w.u64("completedDeliveryIndex", t.CompletedDeliveryIndex)
		w.u64("completedScheduleIndex", t.CompletedScheduleIndex)
		w.u64("nextScheduleUnixMillis", t.NextScheduleUnixMillis)
		w.leave()
	}

	w.count("pendingTimerTicks", len(e.PendingTimerTicks))
	for i := range e.PendingTimerTicks {
		t := &e.PendingTimerTicks[i]
		w.enter("pendingTimerTicks", i)
		w.u32("participantId", t.ParticipantID)
		w.u64("order", t.Order)
		w.text8("name", t.Name)
		w.u64("deliveryIndex", t.DeliveryIndex)
		w.u64("scheduledIndex", t.ScheduledIndex)
		w.u64("scheduledUnixMillis", t.ScheduledUnixMillis)
		w.u32("skippedTicks", t.SkippedTicks)
		w.leave()
	}
}

func (w *writer) record(r *Record) {
	w.u8("kind", uint8(r.Kind))
	w.pid("source", r.Source)
	w.count("metadata", len(r.Metadata))
	for j := range r.Metadata {
		w.enter("metadata", j)
		w.text16("key", r.Metadata[j].Key)
		w.text16("value", r.Metadata[j].Value)
		w.leave()
	}
	w.text8("operationId", r.OperationID)
	w.u8("operationKind", r.OperationKind)
	w.pid("replyRoute", r.ReplyRoute)
	w.u64("deadlineUnixMillis", r.DeadlineUnixMillis)
	w.text16("messageType", r.MessageType)
	w.bytes32("body", r.Body)
}

func (w *writer) pid(leaf string, p *PID) {
	w.presence(leaf, p != nil)
	if p == nil {
		return
	}
	w.enter(leaf, -1)
	w.text16("address", p.Address)
	w.text16("id", p.ID)
	w.leave()
}

// Minimum encoded sizes of vector elements (see the package comment);
// Decode rejects a count that cannot fit before allocating.
const (
	minApplicationState  = 4 + 4
	minRecord            = 1 + 1 + 4 + 1 + 1 + 1 + 8 + 2 + 4
	minSavedWork         = 4 + 8 + minRecord
	minHeader            = 2 + 2
	minTimerRegistration = 4 + 1 + 2 + 8 + 1 + 4 + 1 + 8 + 8 + 8
	minPendingTimerTick  = 4 + 8 + 1 + 8 + 8 + 8 + 4
)

// encodedSize is the exact length of e's stream, so Encode allocates once.
func encodedSize(e *Envelope) int {
	n := 8 + 8 + 1 + len(e.Relocation.CoordinatorFence.NodeRid) + 8 + 8
	n += 1 + 1 + len(e.Object.ID) + 8 + 1 + len(e.Object.StableType)
	n += 1 + len(e.ApplicationVersion)
	n += 4
	for i := range e.ApplicationStates {
		n += minApplicationState + len(e.ApplicationStates[i].State)
	}
	n += 4
	for i := range e.SavedWork {
		r := &e.SavedWork[i].Record
		n += minSavedWork + len(r.OperationID) + len(r.MessageType) + len(r.Body)
		for _, p := range []*PID{r.Source, r.ReplyRoute} {
			if p != nil {
				n += 2 + len(p.Address) + 2 + len(p.ID)
			}
		}
		for j := range r.Metadata {
			n += minHeader + len(r.Metadata[j].Key) + len(r.Metadata[j].Value)
		}
	}
	n += 4
	for i := range e.TimerRegistrations {
		t := &e.TimerRegistrations[i]
		n += minTimerRegistration + len(t.Name) + len(t.HandlerType)
	}
	n += 4
	for i := range e.PendingTimerTicks {
		n += minPendingTimerTick + len(e.PendingTimerTicks[i].Name)
	}
	return n
}
