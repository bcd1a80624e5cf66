package envelope_test

import (
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/relocation/envelope"
)

// The minimal and the full envelope survive Encode → Decode unchanged, and
// re-encoding the decoded value gives the identical bytes.
// Reference: docs/PROTOCOL.md §5.6
func TestRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  *envelope.Envelope
	}{{"minimal", minimalFixture()}, {"full", fullFixture()}} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := envelope.Encode(tc.env)
			require.NoError(t, err)
			got, err := envelope.Decode(b)
			require.NoError(t, err)
			require.Equal(t, tc.env, got)
			again, err := envelope.Encode(got)
			require.NoError(t, err)
			require.Equal(t, b, again)
		})
	}
}

// The encoder agrees with streams written by hand from the format
// description, field by field. Reference: PROTOCOL.md §5.6
func TestEncodeMatchesHandWrittenStream(t *testing.T) {
	b, err := envelope.Encode(fullFixture())
	require.NoError(t, err)
	require.Equal(t, []byte(fullWire()), b)

	minimal := cat(
		wire{}.u64(7).u64(1).text8("node-a").u64(3).u64(2),
		wire{}.u8(1).text8("cart-42").u64(5).text8("shop.Cart"),
		wire{}.text8("1.0.0").u32(0).u32(0).u32(0).u32(0),
	)
	b, err = envelope.Encode(minimalFixture())
	require.NoError(t, err)
	require.Equal(t, []byte(minimal), b)
}

// nil and empty slices are the same on the wire; Decode returns nil for
// empty vectors and bytes. Reference: PROTOCOL.md §5.6
func TestNilAndEmptyEncodeAlike(t *testing.T) {
	a := fullFixture()
	a.ApplicationStates[0].State = nil
	a.SavedWork[0].Record.Body = nil
	b := fullFixture()
	b.ApplicationStates[0].State = []byte{}
	b.SavedWork[0].Record.Body = []byte{}
	b.SavedWork[0].Record.Metadata = []envelope.Header{}
	ea, err := envelope.Encode(a)
	require.NoError(t, err)
	eb, err := envelope.Encode(b)
	require.NoError(t, err)
	require.Equal(t, ea, eb)

	m := minimalFixture()
	m.ApplicationStates = []envelope.ApplicationState{}
	m.TimerRegistrations = []envelope.TimerRegistration{}
	em, err := envelope.Encode(m)
	require.NoError(t, err)
	got, err := envelope.Decode(em)
	require.NoError(t, err)
	require.Equal(t, minimalFixture(), got)

	d, err := envelope.Decode(ea)
	require.NoError(t, err)
	require.Nil(t, d.ApplicationStates[0].State)
	require.Nil(t, d.SavedWork[0].Record.Body)
}

// Decoded byte slices are copies: changing the input afterwards changes
// nothing in the envelope. Reference: PROTOCOL.md §5.6
func TestDecodeDoesNotAlias(t *testing.T) {
	b, err := envelope.Encode(fullFixture())
	require.NoError(t, err)
	got, err := envelope.Decode(b)
	require.NoError(t, err)
	for i := range b {
		b[i] ^= 0xff
	}
	require.Equal(t, fullFixture(), got)
}

// Limits of the length prefixes themselves are accepted.
// Reference: PROTOCOL.md §5.6
func TestEncodeBoundaries(t *testing.T) {
	e := fullFixture()
	e.Object.ID = strings.Repeat("x", 255)
	e.Object.StableType = strings.Repeat("é", 127) + "x"
	e.Relocation.CoordinatorFence.NodeRid = ""
	e.ApplicationVersion = ""
	e.SavedWork[1].Record.Metadata[0].Value = strings.Repeat("v", 65535)
	e.SavedWork[1].Record.OperationID = strings.Repeat("o", 255)
	e.SavedWork[1].Record.Source = &envelope.PID{}
	e.PendingTimerTicks[0].Name = ""
	b, err := envelope.Encode(e)
	require.NoError(t, err)
	got, err := envelope.Decode(b)
	require.NoError(t, err)
	require.Equal(t, e, got)
}

// ruleCase breaks one rule in the full fixture. wireable says the broken
// envelope still fits its length prefixes, so its unchecked bytes are a
// stream Decode must reject too.
type ruleCase struct {
	name     string
	mutate   func(e *envelope.Envelope)
	wireable bool
}

func ruleCases() []ruleCase {
	long8 := strings.Repeat("x", 256)
	long16 := strings.Repeat("x", 65536)
	bad := "ok\xffbad"
	return []ruleCase{
		{"fence nodeRid over 255 bytes", func(e *envelope.Envelope) { e.Relocation.CoordinatorFence.NodeRid = long8 }, false},
		{"fence nodeRid bad UTF-8", func(e *envelope.Envelope) { e.Relocation.CoordinatorFence.NodeRid = bad }, true},
		{"object id empty", func(e *envelope.Envelope) { e.Object.ID = "" }, true},
		{"object id over 255 bytes", func(e *envelope.Envelope) { e.Object.ID = long8 }, false},
		{"object id 128 two-byte runes", func(e *envelope.Envelope) { e.Object.ID = strings.Repeat("é", 128) }, false},
		{"object id bad UTF-8", func(e *envelope.Envelope) { e.Object.ID = "\xc3\x28" }, true},
		{"object id surrogate", func(e *envelope.Envelope) { e.Object.ID = "\xed\xa0\x80" }, true},
		{"object id overlong", func(e *envelope.Envelope) { e.Object.ID = "\xc0\xaf" }, true},
		{"object stableType empty", func(e *envelope.Envelope) { e.Object.StableType = "" }, true},
		{"object stableType over 255 bytes", func(e *envelope.Envelope) { e.Object.StableType = long8 }, false},
		{"object stableType bad UTF-8", func(e *envelope.Envelope) { e.Object.StableType = bad }, true},
		{"applicationVersion over 255 bytes", func(e *envelope.Envelope) { e.ApplicationVersion = long8 }, false},
		{"applicationVersion bad UTF-8", func(e *envelope.Envelope) { e.ApplicationVersion = bad }, true},
		{"state participant 0", func(e *envelope.Envelope) { e.ApplicationStates[0].ParticipantID = 0 }, true},
		{"states unsorted", func(e *envelope.Envelope) {
			s := e.ApplicationStates
			s[0], s[1] = s[1], s[0]
		}, true},
		{"states duplicate participant", func(e *envelope.Envelope) { e.ApplicationStates[1].ParticipantID = 1 }, true},
		{"saved work participant 0", func(e *envelope.Envelope) { e.SavedWork[0].ParticipantID = 0 }, true},
		{"saved work unsorted by participant", func(e *envelope.Envelope) {
			s := e.SavedWork
			s[0], s[1] = s[1], s[0]
		}, true},
		{"saved work unsorted by order", func(e *envelope.Envelope) {
			e.SavedWork[1].ParticipantID = 1
			e.SavedWork[1].Order = 0
		}, true},
		{"saved work duplicate", func(e *envelope.Envelope) {
			e.SavedWork[1].ParticipantID = 1
			e.SavedWork[1].Order = 1
		}, true},
		{"record kind 0", func(e *envelope.Envelope) { e.SavedWork[0].Record.Kind = 0 }, true},
		{"record kind 3", func(e *envelope.Envelope) { e.SavedWork[1].Record.Kind = 3 }, true},
		{"record source address bad UTF-8", func(e *envelope.Envelope) { e.SavedWork[1].Record.Source.Address = bad }, true},
		{"record source id bad UTF-8", func(e *envelope.Envelope) { e.SavedWork[1].Record.Source.ID = bad }, true},
		{"record source id over 65535 bytes", func(e *envelope.Envelope) { e.SavedWork[1].Record.Source.ID = long16 }, false},
		{"record replyRoute address over 65535 bytes", func(e *envelope.Envelope) { e.SavedWork[1].Record.ReplyRoute.Address = long16 }, false},
		{"record replyRoute id bad UTF-8", func(e *envelope.Envelope) { e.SavedWork[1].Record.ReplyRoute.ID = bad }, true},
		{"metadata unsorted", func(e *envelope.Envelope) {
			m := e.SavedWork[1].Record.Metadata
			m[0], m[1] = m[1], m[0]
		}, true},
		{"metadata duplicate key", func(e *envelope.Envelope) { e.SavedWork[1].Record.Metadata[1].Key = "tenant" }, true},
		{"metadata key bad UTF-8", func(e *envelope.Envelope) { e.SavedWork[1].Record.Metadata[0].Key = "\xfe" }, true},
		{"metadata value bad UTF-8", func(e *envelope.Envelope) { e.SavedWork[1].Record.Metadata[1].Value = bad }, true},
		{"metadata value over 65535 bytes", func(e *envelope.Envelope) { e.SavedWork[1].Record.Metadata[1].Value = long16 }, false},
		{"operationId over 255 bytes", func(e *envelope.Envelope) { e.SavedWork[1].Record.OperationID = long8 }, false},
		{"operationId bad UTF-8", func(e *envelope.Envelope) { e.SavedWork[1].Record.OperationID = bad }, true},
		{"messageType empty", func(e *envelope.Envelope) { e.SavedWork[0].Record.MessageType = "" }, true},
		{"messageType bad UTF-8", func(e *envelope.Envelope) { e.SavedWork[0].Record.MessageType = bad }, true},
		{"messageType over 65535 bytes", func(e *envelope.Envelope) { e.SavedWork[0].Record.MessageType = long16 }, false},
		{"timer participant 0", func(e *envelope.Envelope) { e.TimerRegistrations[0].ParticipantID = 0 }, true},
		{"timer name empty", func(e *envelope.Envelope) { e.TimerRegistrations[0].Name = "" }, true},
		{"timer name over 255 bytes", func(e *envelope.Envelope) { e.TimerRegistrations[0].Name = long8 }, false},
		{"timer name bad UTF-8", func(e *envelope.Envelope) { e.TimerRegistrations[0].Name = bad }, true},
		{"timer handlerType bad UTF-8", func(e *envelope.Envelope) { e.TimerRegistrations[0].HandlerType = bad }, true},
		{"timer handlerType over 65535 bytes", func(e *envelope.Envelope) { e.TimerRegistrations[0].HandlerType = long16 }, false},
		{"timers unsorted by name", func(e *envelope.Envelope) {
			t := e.TimerRegistrations[0]
			t.Name = "alarm"
			e.TimerRegistrations = append(e.TimerRegistrations, t)
		}, true},
		{"timers unsorted by participant", func(e *envelope.Envelope) {
			t := e.TimerRegistrations[0]
			e.TimerRegistrations[0].ParticipantID = 2
			e.TimerRegistrations = append(e.TimerRegistrations, t)
		}, true},
		{"timers duplicate", func(e *envelope.Envelope) {
			e.TimerRegistrations = append(e.TimerRegistrations, e.TimerRegistrations[0])
		}, true},
		{"tick participant 0", func(e *envelope.Envelope) { e.PendingTimerTicks[0].ParticipantID = 0 }, true},
		{"tick name bad UTF-8", func(e *envelope.Envelope) { e.PendingTimerTicks[0].Name = bad }, true},
		{"tick name over 255 bytes", func(e *envelope.Envelope) { e.PendingTimerTicks[0].Name = long8 }, false},
		{"ticks unsorted by order", func(e *envelope.Envelope) {
			t := e.PendingTimerTicks[0]
			t.Order = 3
			e.PendingTimerTicks = append(e.PendingTimerTicks, t)
		}, true},
		{"ticks duplicate", func(e *envelope.Envelope) {
			e.PendingTimerTicks = append(e.PendingTimerTicks, e.PendingTimerTicks[0])
		}, true},
	}
}

// Every rule is enforced by Encode: ErrInvalid and no bytes. When the broken
// envelope still fits its length prefixes, its bytes written without
// validation are rejected by Decode with ErrMalformed: Encode and Decode
// share one set of rules. Reference: PROTOCOL.md §5.6
func TestEncodeRejects(t *testing.T) {
	b, err := envelope.Encode(nil)
	require.ErrorIs(t, err, envelope.ErrInvalid)
	require.Nil(t, b)
	for _, tc := range ruleCases() {
		t.Run(tc.name, func(t *testing.T) {
			e := fullFixture()
			tc.mutate(e)
			b, err := envelope.Encode(e)
			require.ErrorIs(t, err, envelope.ErrInvalid)
			require.NotErrorIs(t, err, envelope.ErrMalformed)
			require.Nil(t, b)
			if tc.wireable {
				_, err := envelope.Decode(envelope.EncodeUnchecked(e))
				require.ErrorIs(t, err, envelope.ErrMalformed)
			}
		})
	}
}

// Hand-written streams breaking each rule are rejected with ErrMalformed;
// the same streams with the rule respected decode. Reference: PROTOCOL.md §5.6
func TestDecodeRejectsHandWrittenStreams(t *testing.T) {
	ok := okRecord()
	with := func(f func(r *rawRecord)) rawRecord {
		r := okRecord()
		f(&r)
		return r
	}
	h := func(f func(h *head)) head {
		x := okHead()
		f(&x)
		return x
	}
	good := [][]byte{
		stream(okHead(), nil, nil, nil, nil),
		stream(okHead(), []wire{state(1, "a"), state(2, "")}, []wire{work(1, 9, ok), work(2, 0, ok), work(2, 1, ok)},
			[]wire{timer(1, "a", ""), timer(1, "ab", ""), timer(2, "a", "")}, []wire{tick(1, 5, ""), tick(1, 6, "x"), tick(2, 0, "x")}),
		stream(okHead(), nil, []wire{work(1, 1, with(func(r *rawRecord) {
			r.kind, r.sourcePresence, r.replyPresence = 2, 1, 1
			r.headers = [][2]string{{"a", ""}, {"ab", "x"}, {"b", ""}}
		}))}, nil, nil),
		fullWire(),
	}
	for i, b := range good {
		_, err := envelope.Decode(b)
		require.NoError(t, err, "good stream %d", i)
	}

	bad := map[string][]byte{
		"object id empty":           stream(h(func(h *head) { h.id = "" }), nil, nil, nil, nil),
		"object stableType empty":   stream(h(func(h *head) { h.stableType = "" }), nil, nil, nil, nil),
		"object id bad UTF-8":       stream(h(func(h *head) { h.id = "\xff" }), nil, nil, nil, nil),
		"nodeRid bad UTF-8":         stream(h(func(h *head) { h.nodeRid = "\xc3" }), nil, nil, nil, nil),
		"applicationVersion bad":    stream(h(func(h *head) { h.version = "\xed\xbf\xbf" }), nil, nil, nil, nil),
		"trailing byte":             append(stream(okHead(), nil, nil, nil, nil), 0),
		"trailing zero vector":      append(stream(okHead(), nil, nil, nil, nil), 0, 0, 0, 0),
		"states unsorted":           stream(okHead(), []wire{state(2, ""), state(1, "")}, nil, nil, nil),
		"states duplicate":          stream(okHead(), []wire{state(1, "a"), state(1, "b")}, nil, nil, nil),
		"state participant 0":       stream(okHead(), []wire{state(0, "")}, nil, nil, nil),
		"work unsorted":             stream(okHead(), nil, []wire{work(2, 0, ok), work(1, 0, ok)}, nil, nil),
		"work unsorted by order":    stream(okHead(), nil, []wire{work(1, 5, ok), work(1, 4, ok)}, nil, nil),
		"work duplicate":            stream(okHead(), nil, []wire{work(1, 1, ok), work(1, 1, ok)}, nil, nil),
		"work participant 0":        stream(okHead(), nil, []wire{work(0, 1, ok)}, nil, nil),
		"record kind 0":             stream(okHead(), nil, []wire{work(1, 1, with(func(r *rawRecord) { r.kind = 0 }))}, nil, nil),
		"record kind 3":             stream(okHead(), nil, []wire{work(1, 1, with(func(r *rawRecord) { r.kind = 3 }))}, nil, nil),
		"source presence 2":         stream(okHead(), nil, []wire{work(1, 1, with(func(r *rawRecord) { r.sourcePresence = 2 }))}, nil, nil),
		"replyRoute presence 0xff":  stream(okHead(), nil, []wire{work(1, 1, with(func(r *rawRecord) { r.replyPresence = 0xff }))}, nil, nil),
		"source address bad UTF-8":  stream(okHead(), nil, []wire{work(1, 1, with(func(r *rawRecord) { r.sourcePresence, r.source.address = 1, "\xff" }))}, nil, nil),
		"reply id bad UTF-8":        stream(okHead(), nil, []wire{work(1, 1, with(func(r *rawRecord) { r.replyPresence, r.reply.id = 1, "\xff" }))}, nil, nil),
		"headers unsorted":          stream(okHead(), nil, []wire{work(1, 1, with(func(r *rawRecord) { r.headers = [][2]string{{"b", ""}, {"a", ""}} }))}, nil, nil),
		"headers duplicate":         stream(okHead(), nil, []wire{work(1, 1, with(func(r *rawRecord) { r.headers = [][2]string{{"a", "1"}, {"a", "2"}} }))}, nil, nil),
		"header key bad UTF-8":      stream(okHead(), nil, []wire{work(1, 1, with(func(r *rawRecord) { r.headers = [][2]string{{"\xff", ""}} }))}, nil, nil),
		"header value bad UTF-8":    stream(okHead(), nil, []wire{work(1, 1, with(func(r *rawRecord) { r.headers = [][2]string{{"k", "\xff"}} }))}, nil, nil),
		"operationId bad UTF-8":     stream(okHead(), nil, []wire{work(1, 1, with(func(r *rawRecord) { r.operationID = "\xff" }))}, nil, nil),
		"messageType empty":         stream(okHead(), nil, []wire{work(1, 1, with(func(r *rawRecord) { r.messageType = "" }))}, nil, nil),
		"messageType bad UTF-8":     stream(okHead(), nil, []wire{work(1, 1, with(func(r *rawRecord) { r.messageType = "a\x80" }))}, nil, nil),
		"timers unsorted by name":   stream(okHead(), nil, nil, []wire{timer(1, "b", ""), timer(1, "a", "")}, nil),
		"timers unsorted by prefix": stream(okHead(), nil, nil, []wire{timer(1, "ab", ""), timer(1, "a", "")}, nil),
		"timers unsorted by pid":    stream(okHead(), nil, nil, []wire{timer(2, "a", ""), timer(1, "b", "")}, nil),
		"timers duplicate":          stream(okHead(), nil, nil, []wire{timer(1, "a", ""), timer(1, "a", "")}, nil),
		"timer name empty":          stream(okHead(), nil, nil, []wire{timer(1, "", "")}, nil),
		"timer name bad UTF-8":      stream(okHead(), nil, nil, []wire{timer(1, "\xff", "")}, nil),
		"timer handler bad UTF-8":   stream(okHead(), nil, nil, []wire{timer(1, "a", "\xff")}, nil),
		"timer participant 0":       stream(okHead(), nil, nil, []wire{timer(0, "a", "")}, nil),
		"ticks unsorted":            stream(okHead(), nil, nil, nil, []wire{tick(1, 2, ""), tick(1, 1, "")}),
		"ticks unsorted by pid":     stream(okHead(), nil, nil, nil, []wire{tick(2, 1, ""), tick(1, 2, "")}),
		"ticks duplicate":           stream(okHead(), nil, nil, nil, []wire{tick(1, 1, "a"), tick(1, 1, "b")}),
		"tick participant 0":        stream(okHead(), nil, nil, nil, []wire{tick(0, 1, "")}),
		"tick name bad UTF-8":       stream(okHead(), nil, nil, nil, []wire{tick(1, 1, "\xff")}),
		// Counts and lengths that cannot fit in the remaining bytes.
		"states count 2^32-1":         cat(okHead().wire(), wire{}.u32(0xffffffff), wire{}.u32(0).u32(0).u32(0)),
		"states count over min size":  cat(okHead().wire(), wire{}.u32(3), state(1, ""), state(2, ""), wire{}.u32(0).u32(0).u32(0)),
		"work count over min size":    cat(okHead().wire(), vec(), wire{}.u32(2), work(1, 1, ok), wire{}.u32(0).u32(0)),
		"timers count over min size":  cat(okHead().wire(), vec(), vec(), wire{}.u32(2), timer(1, "a", ""), wire{}.u32(0)),
		"ticks count over min size":   cat(okHead().wire(), vec(), vec(), vec(), wire{}.u32(2), tick(1, 1, "")),
		"metadata count 2^32-1":       stream(okHead(), nil, []wire{work(1, 1, with(func(r *rawRecord) { r.overrideHeaderCount, r.headerCount = true, 0xffffffff }))}, nil, nil),
		"body length 2^32-1":          stream(okHead(), nil, []wire{work(1, 1, with(func(r *rawRecord) { r.overrideBodyLength, r.bodyLength = true, 0xffffffff }))}, nil, nil),
		"body length one too many":    stream(okHead(), nil, []wire{work(1, 1, with(func(r *rawRecord) { r.body, r.overrideBodyLength, r.bodyLength = []byte("abc"), true, 20 }))}, nil, nil),
		"messageType length too long": stream(okHead(), nil, []wire{work(1, 1, with(func(r *rawRecord) { r.overrideMessageTypeLength, r.messageTypeLength = true, 0xffff }))}, nil, nil),
		"state length 2^32-1":         cat(okHead().wire(), wire{}.u32(1).u32(1).u32(0xffffffff), wire{}.u32(0).u32(0).u32(0)),
		"empty input":                 nil,
		"one byte":                    {0},
	}
	for name, b := range bad {
		t.Run(name, func(t *testing.T) {
			e, err := envelope.Decode(b)
			require.ErrorIs(t, err, envelope.ErrMalformed)
			require.NotErrorIs(t, err, envelope.ErrInvalid)
			require.Nil(t, e)
		})
	}
}

// Every proper prefix of a valid stream is rejected, and so is the stream
// with any byte appended. Reference: PROTOCOL.md §5.6
func TestDecodeRejectsEveryTruncation(t *testing.T) {
	for _, e := range []*envelope.Envelope{minimalFixture(), fullFixture()} {
		b, err := envelope.Encode(e)
		require.NoError(t, err)
		for n := range len(b) {
			got, err := envelope.Decode(b[:n:n])
			require.ErrorIs(t, err, envelope.ErrMalformed, "prefix of %d bytes", n)
			require.Nil(t, got)
		}
		for _, x := range []byte{0, 1, 0xff} {
			_, err := envelope.Decode(append(append([]byte(nil), b...), x))
			require.ErrorIs(t, err, envelope.ErrMalformed)
		}
	}
}

// A hostile count is refused before anything is allocated for it.
// Reference: PROTOCOL.md §5.6
func TestDecodeHostileCountDoesNotAllocate(t *testing.T) {
	for _, b := range [][]byte{
		cat(okHead().wire(), vec(), wire{}.u32(0xffffffff)),
		cat(okHead().wire(), wire{}.u32(0xffffffff)),
		cat(okHead().wire(), vec(), vec(), wire{}.u32(0x7fffffff)),
	} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		_, err := envelope.Decode(b)
		runtime.ReadMemStats(&after)
		require.ErrorIs(t, err, envelope.ErrMalformed)
		require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<20))
	}
}

// DecodeOwned decodes the same values as Decode, without copying the
// byte fields out of a stream the caller hands over: a large state is not
// copied once more on the target.
// Reference: PROTOCOL.md §5.7 (the payload is restored once, whole).
func TestDecodeOwnedAliasesTheStream(t *testing.T) {
	b, err := envelope.Encode(fullFixture())
	require.NoError(t, err)
	got, err := envelope.DecodeOwned(b)
	require.NoError(t, err)
	require.Equal(t, fullFixture(), got)
	state := got.ApplicationStates[0].State
	require.NotEmpty(t, state)
	for i := range b {
		b[i] ^= 0xff
	}
	require.NotEqual(t, fullFixture().ApplicationStates[0].State, state, "the state aliases the stream")
	_, err = envelope.DecodeOwned(b[:len(b)-1])
	require.ErrorIs(t, err, envelope.ErrMalformed, "as strict as Decode")
}
