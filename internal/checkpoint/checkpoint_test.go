package checkpoint

import (
	"bytes"
	"context"
	"encoding/binary"
	"hash/crc32"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
)

func TestEncodeDecodeRoundTrip(t *testing.T) {
	for _, c := range []Checkpoint{
		{Fence: Fence{1, 2, 3}, StableType: "room", ApplicationVersion: "v2", TakenUnixNanos: 99, State: []byte("hello")},
		{Fence: Fence{1<<63 - 1, 1, 0}, StableType: "ü", NoState: true, State: []byte{}},
		{StableType: "x", State: bytes.Repeat([]byte{7}, 1<<20)},
	} {
		b, err := Encode(c)
		require.NoError(t, err)
		got, err := Decode(b)
		require.NoError(t, err)
		require.Equal(t, c.Fence, got.Fence)
		require.Equal(t, c.StableType, got.StableType)
		require.Equal(t, c.ApplicationVersion, got.ApplicationVersion)
		require.Equal(t, c.TakenUnixNanos, got.TakenUnixNanos)
		require.Equal(t, c.NoState, got.NoState)
		require.True(t, bytes.Equal(c.State, got.State))
	}
}

// Every single-bit flip and every truncation of a checkpoint is refused:
// nothing corrupt is ever restored.
func TestDecodeRefusesEveryCorruption(t *testing.T) {
	b, err := Encode(Checkpoint{Fence: Fence{5, 6, 7}, StableType: "room", State: []byte("state")})
	require.NoError(t, err)
	for i := range b {
		for bit := 0; bit < 8; bit++ {
			c := append([]byte{}, b...)
			c[i] ^= 1 << bit
			_, err := Decode(c)
			require.ErrorIs(t, err, ErrCorrupt, "byte %d bit %d", i, bit)
		}
	}
	for n := 0; n < len(b); n++ {
		_, err := Decode(b[:n])
		require.ErrorIs(t, err, ErrCorrupt, "truncated to %d", n)
	}
}

// The stored checkpoint wins unless the capture's fence is above it: a
// later owner generation (a move's target), a later object generation (a
// recovery), or a later capture of the same incarnation.
func TestJudgeOrdersByGenerationsThenSequence(t *testing.T) {
	stored := &Checkpoint{Fence: Fence{10, 2, 5}}
	require.Equal(t, Write, Judge(Fence{10, 2, 6}, stored, nil))
	require.Equal(t, Write, Judge(Fence{10, 3, 1}, stored, nil))
	require.Equal(t, Write, Judge(Fence{11, 1, 1}, stored, nil))
	require.Equal(t, Superseded, Judge(Fence{10, 2, 5}, stored, nil), "the same capture again")
	require.Equal(t, Superseded, Judge(Fence{10, 1, 99}, stored, nil), "a moved-away source's late capture")
	require.Equal(t, Superseded, Judge(Fence{9, 9, 9}, stored, nil), "an ended incarnation's late capture")
	require.Equal(t, Write, Judge(Fence{1, 1, 1}, nil, nil))
	require.Equal(t, Unreadable, Judge(Fence{1, 1, 1}, nil, ErrCorrupt))
}

func TestPolicyDecidesWhenToCapture(t *testing.T) {
	t0 := time.Unix(1000, 0)
	every := Policy{Every: 3}
	var d Dirty
	require.False(t, every.AfterTurn(&d, t0))
	require.False(t, every.AfterTurn(&d, t0))
	require.True(t, every.AfterTurn(&d, t0), "the third turn")
	require.False(t, every.Due(d, t0.Add(time.Hour)), "Every alone never falls due by the clock")

	p := Policy{Interval: time.Second, Idle: 200 * time.Millisecond}
	d = Dirty{}
	require.False(t, p.Due(d, t0), "nothing handled: nothing to capture")
	p.AfterTurn(&d, t0)
	require.False(t, p.Due(d, t0.Add(100*time.Millisecond)))
	require.True(t, p.Due(d, t0.Add(200*time.Millisecond)), "idle for Idle")
	for i := 1; i <= 9; i++ { // busy: a turn every 100 ms
		p.AfterTurn(&d, t0.Add(time.Duration(i)*100*time.Millisecond))
		require.False(t, p.Due(d, t0.Add(time.Duration(i)*100*time.Millisecond+50*time.Millisecond)))
	}
	require.True(t, p.Due(d, t0.Add(time.Second)), "busy: at most Interval after the first uncaptured turn")

	require.Error(t, Policy{Every: -1}.Validate())
	require.Error(t, Policy{Interval: time.Millisecond}.Validate())
	require.Error(t, Policy{Idle: -time.Second}.Validate())
	require.NoError(t, DefaultPolicy.Validate())
	require.True(t, Policy{}.Off())
	require.Equal(t, 50*time.Millisecond, p.Tick())
}

func newWriter(t *testing.T, s location.CheckpointStore) *Writer {
	w := NewWriter(Config{Store: s})
	t.Cleanup(w.Stop)
	return w
}

func stored(t *testing.T, s location.CheckpointStore, key location.AuthorityKey) Checkpoint {
	t.Helper()
	data, _, err := s.GetCheckpoint(context.Background(), key)
	require.NoError(t, err)
	c, err := Decode(data)
	require.NoError(t, err)
	return c
}

var key = location.Key(location.KindInstanceSpot, "room-1")

func cp(g, o, s uint64, state string) Checkpoint {
	return Checkpoint{Fence: Fence{g, o, s}, StableType: "room", State: []byte(state)}
}

func TestWriterStoresTheNewestCapture(t *testing.T) {
	s := memstore.New()
	w := newWriter(t, s)
	for i := uint64(1); i <= 50; i++ {
		w.Submit(key, cp(1, 1, i, "s"+string(rune('0'+i%10))))
	}
	waitIdle(t, w, "the writer to go idle")
	require.Equal(t, Fence{1, 1, 50}, stored(t, s, key).Fence, "the last capture is the one stored")
	st := w.Stats()
	require.Equal(t, uint64(50), st.Written+st.Coalesced+st.Superseded, "every capture accounted for: %+v", st)
}

// A moved-away or ended incarnation's late capture never replaces a
// later incarnation's checkpoint, whichever node writes it.
func TestWriterNeverReplacesALaterIncarnation(t *testing.T) {
	s := memstore.New()
	source, target := newWriter(t, s), newWriter(t, s)
	target.Submit(key, cp(1, 2, 1, "target"))
	waitIdle(t, target, "the target's write")
	source.Submit(key, cp(1, 1, 40, "source, late"))
	waitIdle(t, source, "the source's write")
	require.Equal(t, "target", string(stored(t, s, key).State))
	require.Equal(t, uint64(1), source.Stats().Superseded)
}

// A claim rewrites the stored checkpoint under the new incarnation's
// fence: an earlier incarnation's capture after it is superseded, and a
// missing checkpoint is claimed with a NoState marker.
func TestClaimFencesOutTheEarlierIncarnation(t *testing.T) {
	s := memstore.New()
	old, recovering := newWriter(t, s), newWriter(t, s)
	old.Submit(key, cp(5, 1, 7, "last"))
	waitIdle(t, old, "the old owner's write")
	got, err := recovering.Claim(context.Background(), key, Fence{6, 1, 0}, "room", "")
	require.NoError(t, err)
	require.Equal(t, "last", string(got.State))
	require.False(t, got.NoState)
	old.Submit(key, cp(5, 1, 8, "too late"))
	waitIdle(t, old, "the late write")
	c := stored(t, s, key)
	require.Equal(t, "last", string(c.State))
	require.Equal(t, Fence{6, 1, 0}, c.Fence)

	other := location.Key(location.KindActor, "never-captured")
	got, err = recovering.Claim(context.Background(), other, Fence{2, 1, 0}, "room", "")
	require.NoError(t, err)
	require.True(t, got.NoState)
	old.Submit(other, cp(1, 1, 1, "late first"))
	waitIdle(t, old, "the late first write")
	require.True(t, stored(t, s, other).NoState, "the marker fenced the late first write out")
}

// Another stable type's checkpoint is not the object's state; a corrupt
// one is never restored, and stops no recovery: the claim takes its place
// with no state, said loudly (checkpoint_corrupt).
func TestClaimOfForeignOrCorruptCheckpoint(t *testing.T) {
	s := memstore.New()
	var logs bytes.Buffer
	w := NewWriter(Config{Store: s, Log: zerolog.New(&logs)})
	t.Cleanup(w.Stop)
	w.Submit(key, Checkpoint{Fence: Fence{1, 1, 1}, StableType: "cart", State: []byte("x")})
	waitIdle(t, w, "the write")
	got, err := w.Claim(context.Background(), key, Fence{2, 1, 0}, "room", "")
	require.NoError(t, err)
	require.True(t, got.NoState)

	bad := location.Key(location.KindActor, "bad")
	_, err = s.PutCheckpoint(context.Background(), bad, 0, []byte("not a checkpoint at all, no"))
	require.NoError(t, err)
	got, err = w.Claim(context.Background(), bad, Fence{2, 1, 0}, "room", "")
	require.NoError(t, err)
	require.True(t, got.NoState, "nothing corrupt is restored")
	require.Equal(t, Fence{2, 1, 0}, stored(t, s, bad).Fence, "the claim holds the key")
	require.Contains(t, logs.String(), `"event":"checkpoint_corrupt"`)
}

// A close leaves a tombstone above every capture of the closed
// incarnation: none of them, however late, brings its state back, and a
// new object of the same ID starts empty.
func TestForgetLeavesATombstoneNoLateCaptureRevives(t *testing.T) {
	s := memstore.New()
	w, late := newWriter(t, s), newWriter(t, s)
	w.Submit(key, cp(1, 1, 1, "a"))
	require.NoError(t, w.Forget(context.Background(), key, 1, 1, "room"))
	c := stored(t, s, key)
	require.True(t, c.NoState)
	late.Submit(key, cp(1, 1, 99, "late"))
	waitIdle(t, late, "the late capture")
	require.True(t, stored(t, s, key).NoState, "the late capture did not revive the closed state")
	got, err := late.Claim(context.Background(), key, Fence{2, 1, 0}, "room", "")
	require.NoError(t, err)
	require.True(t, got.NoState, "a new object of the ID starts empty")
}

// A node whose lease is not in force writes nothing.
func TestFencedWriterWritesNothing(t *testing.T) {
	s := memstore.New()
	w := NewWriter(Config{Store: s, Lease: func() error { return location.ErrLeaseEnded }})
	defer w.Stop()
	w.Submit(key, cp(1, 1, 1, "a"))
	waitIdle(t, w, "the writer to go idle")
	_, _, err := s.GetCheckpoint(context.Background(), key)
	require.ErrorIs(t, err, location.ErrNotFound)
	require.Equal(t, uint64(1), w.Stats().Fenced)
}

// waitIdle waits for w's writes to end and names what it waited for.
func waitIdle(t *testing.T, w *Writer, what string) {
	t.Helper()
	testwait.For(t, w.Idle, what)
}

// A checkpoint of a newer format (a newer node's, in a rolling upgrade) is
// intact: a claim neither restores nor replaces it.
func TestClaimLeavesANewerFormatAlone(t *testing.T) {
	s := memstore.New()
	w := newWriter(t, s)
	b, err := Encode(Checkpoint{Fence: Fence{1, 1, 1}, StableType: "room", State: []byte("x")})
	require.NoError(t, err)
	b[4] = version + 1
	b = binary.BigEndian.AppendUint32(b[:len(b)-4], crc32.Checksum(b[:len(b)-4], castagnoli))
	newer := location.Key(location.KindActor, "newer")
	_, err = s.PutCheckpoint(context.Background(), newer, 0, b)
	require.NoError(t, err)
	_, err = w.Claim(context.Background(), newer, Fence{1, 2, 0}, "room", "")
	require.ErrorIs(t, err, ErrNewerFormat)
	data, _, err := s.GetCheckpoint(context.Background(), newer)
	require.NoError(t, err)
	require.Equal(t, b, data, "left as the newer node wrote it")
}
