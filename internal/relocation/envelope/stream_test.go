package envelope_test

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/relocation/envelope"
)

// EncodeStream writes the stream Encode writes, with large byte fields
// left in place: split at any limit, its chunks are Encode's split at the
// same limit, with the same manifest, and a large state is not copied.
func TestEncodeStreamIsEncodeWithoutTheCopies(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	big := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		return b
	}
	for _, sizes := range [][]int{{0}, {10}, {64 << 10}, {64<<10 - 1, 64 << 10, 1}, {300 << 10, 5, 200 << 10}, {1 << 20}} {
		e := fullFixture()
		states := e.ApplicationStates[:0]
		for i, n := range sizes {
			states = append(states, envelope.ApplicationState{ParticipantID: uint32(i + 1), State: big(n)})
		}
		e.ApplicationStates = states
		if len(e.SavedWork) > 0 {
			e.SavedWork[0].Record.Body = big(100 << 10)
		}
		want, err := envelope.Encode(e)
		require.NoError(t, err)
		st, err := envelope.EncodeStream(e)
		require.NoError(t, err)
		require.Equal(t, len(want), st.Len())
		require.Equal(t, want, st.Bytes())
		for _, limit := range []int{1 << 10, 7, 64 << 10, 256 << 10, len(want), len(want) + 3} {
			if limit < 7<<10 && len(want) > 1<<20 {
				continue // too many chunks to compare quickly
			}
			wm, wc, err := envelope.Split(want, limit)
			require.NoError(t, err)
			gm, gc, err := envelope.SplitStream(st, limit)
			require.NoError(t, err)
			require.Equal(t, wm, gm, "sizes %v limit %d", sizes, limit)
			require.Equal(t, len(wc), len(gc))
			for i := range wc {
				require.Equal(t, wc[i].Index, gc[i].Index)
				require.Equal(t, wc[i].Offset, gc[i].Offset)
				require.True(t, bytes.Equal(wc[i].Data, gc[i].Data), "sizes %v limit %d chunk %d", sizes, limit, i)
			}
		}
		// A state of 64 KiB or more is one of the stream's pieces, not a copy.
		for _, s := range e.ApplicationStates {
			if len(s.State) < 64<<10 {
				continue
			}
			_, chunks, err := envelope.SplitStream(st, len(want))
			require.NoError(t, err)
			require.Len(t, chunks, 1, "one chunk across pieces is a copy")
			_, chunks, err = envelope.SplitStream(st, 1<<10)
			require.NoError(t, err)
			found := false
			for _, c := range chunks {
				lo := uintptr(unsafe.Pointer(unsafe.SliceData(s.State)))
				at := uintptr(unsafe.Pointer(unsafe.SliceData(c.Data)))
				if len(c.Data) == 1<<10 && at >= lo && at+uintptr(len(c.Data)) <= lo+uintptr(len(s.State)) {
					found = true
				}
			}
			require.True(t, found, "a chunk inside the state is a slice of it (sizes %v)", sizes)
		}
	}
}

// backed returns chunks of stream cut at limit, each lying at its offset in
// one copy of the stream (as the chunk link reads them), and that copy.
func backed(t *testing.T, stream []byte, limit int) (envelope.Manifest, []envelope.Chunk, []byte) {
	t.Helper()
	whole := bytes.Clone(stream)
	m, chunks, err := envelope.Split(whole, limit)
	require.NoError(t, err)
	for i := range chunks {
		chunks[i].Backing = whole
	}
	return m, chunks, whole
}

// Chunks that lie in place in a buffer of the whole stream are not copied:
// the assembler keeps that buffer, and Take hands it over.
func TestAssemblerKeepsTheBackingOfChunksInPlace(t *testing.T) {
	stream := fullStream(t)
	m, chunks, whole := backed(t, stream, 7)
	a, err := envelope.NewAssembler(m, 1<<20)
	require.NoError(t, err)
	for _, c := range chunks {
		require.NoError(t, a.Add(c))
	}
	require.NoError(t, a.Add(chunks[0]), "an identical duplicate is still fine")
	got, err := a.Take()
	require.NoError(t, err)
	require.Equal(t, stream, got)
	require.Same(t, &whole[0], &got[0], "the backing itself, not a copy")
}

// A chunk from elsewhere (a resend on the other connection) makes the
// buffer the assembler's own: what came in place is copied once, the
// rest is copied as it comes, and the backing is never written.
func TestAssemblerLeavesTheBackingForAChunkFromElsewhere(t *testing.T) {
	stream := fullStream(t)
	m, chunks, whole := backed(t, stream, 7)
	a, err := envelope.NewAssembler(m, 1<<20)
	require.NoError(t, err)
	half := len(chunks) / 2
	for _, c := range chunks[:half] {
		require.NoError(t, a.Add(c))
	}
	elsewhere := chunks[len(chunks)-1]
	elsewhere.Data, elsewhere.Backing = bytes.Clone(elsewhere.Data), nil
	require.NoError(t, a.Add(elsewhere))
	// The part that came in place was copied: the backing no longer
	// matters to the assembler.
	for i := range whole[:chunks[half].Offset] {
		whole[i] ^= 0xff
	}
	for _, c := range chunks[half : len(chunks)-1] {
		require.NoError(t, a.Add(c))
	}
	got, err := a.Take()
	require.NoError(t, err)
	require.Equal(t, stream, got)
	require.NotSame(t, &whole[0], &got[0])

	// A backing that is not the whole stream's length is not kept.
	short := bytes.Clone(stream[:len(stream)-1])
	c := envelope.Chunk{Index: 0, Offset: 0, Data: short[:7], Backing: short}
	b, err := envelope.NewAssembler(m, 1<<20)
	require.NoError(t, err)
	require.NoError(t, b.Add(c))
	short[0] ^= 0xff
	_, plain, err := envelope.Split(bytes.Clone(stream), 7)
	require.NoError(t, err)
	for _, c := range plain[1:] {
		require.NoError(t, b.Add(c))
	}
	got, err = b.Take()
	require.NoError(t, err)
	require.Equal(t, stream, got, "the short backing's chunk was copied")
}
