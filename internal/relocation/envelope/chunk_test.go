package envelope_test

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/relocation/envelope"
)

// CRC-32C check value. Reference: docs/PROTOCOL.md §5.6
func TestChecksumKnownAnswer(t *testing.T) {
	require.Equal(t, uint32(0xE3069283), envelope.Checksum([]byte("123456789")))
	require.Equal(t, uint32(0), envelope.Checksum(nil))
}

func fullStream(t *testing.T) []byte {
	t.Helper()
	b, err := envelope.Encode(fullFixture())
	require.NoError(t, err)
	return b
}

func assemble(t *testing.T, m envelope.Manifest, chunks []envelope.Chunk) []byte {
	t.Helper()
	a, err := envelope.NewAssembler(m, 1<<20)
	require.NoError(t, err)
	for i, c := range chunks {
		require.False(t, a.Complete(), "complete before chunk %d of %d", i, len(chunks))
		require.NoError(t, a.Add(c))
	}
	require.True(t, a.Complete())
	b, err := a.Bytes()
	require.NoError(t, err)
	return b
}

// Split cuts at every chunkLimit bytes; the chunks reassemble in order, in
// reverse and shuffled. Reference: PROTOCOL.md §5.6
func TestSplitAndAssemble(t *testing.T) {
	stream := fullStream(t)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, limit := range []int{1, 7, goldenChunkLimit, len(stream), len(stream) + 100} {
		m, chunks, err := envelope.Split(stream, limit)
		require.NoError(t, err)
		want := (len(stream) + limit - 1) / limit
		require.Equal(t, envelope.Manifest{TotalLength: uint64(len(stream)), ChunkCount: uint32(want), ChecksumCRC32C: envelope.Checksum(stream)}, m)
		require.Len(t, chunks, want)
		var joined []byte
		for i, c := range chunks {
			require.EqualValues(t, i, c.Index)
			require.EqualValues(t, i*limit, c.Offset)
			if i < len(chunks)-1 {
				require.Len(t, c.Data, limit)
			} else {
				require.Equal(t, len(stream)-i*limit, len(c.Data))
			}
			joined = append(joined, c.Data...)
		}
		require.Equal(t, stream, joined)

		require.Equal(t, stream, assemble(t, m, chunks), "in order, limit %d", limit)
		reversed := make([]envelope.Chunk, len(chunks))
		for i, c := range chunks {
			reversed[len(chunks)-1-i] = c
		}
		require.Equal(t, stream, assemble(t, m, reversed), "reversed, limit %d", limit)
		for range 3 {
			shuffled := append([]envelope.Chunk(nil), chunks...)
			rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
			require.Equal(t, stream, assemble(t, m, shuffled), "shuffled, limit %d", limit)
		}
	}
}

// Split refuses an empty stream and a chunk limit below 1.
// Reference: PROTOCOL.md §5.6
func TestSplitRejects(t *testing.T) {
	for _, tc := range []struct {
		stream []byte
		limit  int
	}{{nil, 1}, {[]byte{}, 8}, {[]byte("x"), 0}, {[]byte("x"), -1}} {
		m, chunks, err := envelope.Split(tc.stream, tc.limit)
		require.ErrorIs(t, err, envelope.ErrInvalid)
		require.Zero(t, m)
		require.Nil(t, chunks)
	}
}

// A sender may cut anywhere: non-uniform chunks assemble, in any order.
// Reference: PROTOCOL.md §5.6, §5.7
func TestAssembleNonUniformChunks(t *testing.T) {
	stream := fullStream(t)
	cuts := []int{0, 1, 50, 51, 200, 333, len(stream)}
	chunks := make([]envelope.Chunk, len(cuts)-1)
	for i := range chunks {
		chunks[i] = envelope.Chunk{Index: uint32(i), Offset: uint64(cuts[i]), Data: stream[cuts[i]:cuts[i+1]]}
	}
	m := envelope.Manifest{TotalLength: uint64(len(stream)), ChunkCount: uint32(len(chunks)), ChecksumCRC32C: envelope.Checksum(stream)}
	require.Equal(t, stream, assemble(t, m, chunks))

	rng := rand.New(rand.NewPCG(3, 4))
	for range 50 {
		var chunks []envelope.Chunk
		for off := 0; off < len(stream); {
			n := min(1+rng.IntN(90), len(stream)-off)
			chunks = append(chunks, envelope.Chunk{Index: uint32(len(chunks)), Offset: uint64(off), Data: stream[off : off+n]})
			off += n
		}
		m := envelope.Manifest{TotalLength: uint64(len(stream)), ChunkCount: uint32(len(chunks)), ChecksumCRC32C: envelope.Checksum(stream)}
		rng.Shuffle(len(chunks), func(i, j int) { chunks[i], chunks[j] = chunks[j], chunks[i] })
		require.Equal(t, stream, assemble(t, m, chunks))
	}
}

// An identical duplicate is a no-op; a duplicate index with other bytes or
// another offset, and an overlap between indexes, are ErrConflict and
// change nothing. Reference: PROTOCOL.md §5.7
func TestAssemblerDuplicatesAndConflicts(t *testing.T) {
	stream := fullStream(t)
	m, chunks, err := envelope.Split(stream, 7)
	require.NoError(t, err)
	a, err := envelope.NewAssembler(m, uint64(len(stream)))
	require.NoError(t, err)

	require.NoError(t, a.Add(chunks[3]))
	require.NoError(t, a.Add(envelope.Chunk{Index: 3, Offset: chunks[3].Offset, Data: bytes.Clone(chunks[3].Data)}), "identical duplicate")

	changed := bytes.Clone(chunks[3].Data)
	changed[0] ^= 1
	require.ErrorIs(t, a.Add(envelope.Chunk{Index: 3, Offset: chunks[3].Offset, Data: changed}), envelope.ErrConflict)
	require.ErrorIs(t, a.Add(envelope.Chunk{Index: 3, Offset: chunks[4].Offset, Data: chunks[4].Data}), envelope.ErrConflict, "same index, other offset")
	require.ErrorIs(t, a.Add(envelope.Chunk{Index: 3, Offset: chunks[3].Offset, Data: chunks[3].Data[:3]}), envelope.ErrConflict, "same index, shorter")
	// Different indexes whose ranges overlap, from either side or inside.
	require.ErrorIs(t, a.Add(envelope.Chunk{Index: 4, Offset: chunks[3].Offset + 6, Data: stream[27:35]}), envelope.ErrConflict)
	require.ErrorIs(t, a.Add(envelope.Chunk{Index: 2, Offset: chunks[3].Offset - 1, Data: stream[20:22]}), envelope.ErrConflict)
	require.ErrorIs(t, a.Add(envelope.Chunk{Index: 9, Offset: chunks[3].Offset + 2, Data: stream[23:24]}), envelope.ErrConflict)
	require.ErrorIs(t, a.Add(envelope.Chunk{Index: 9, Offset: 0, Data: stream}), envelope.ErrConflict)

	for i, c := range chunks {
		if i != 3 {
			require.NoError(t, a.Add(c))
		}
	}
	require.True(t, a.Complete())
	got, err := a.Bytes()
	require.NoError(t, err)
	require.Equal(t, stream, got)
	require.NoError(t, a.Add(chunks[0]), "identical duplicate after completion")
	require.ErrorIs(t, a.Add(envelope.Chunk{Index: 0, Offset: 0, Data: []byte{stream[0] ^ 0xff}}), envelope.ErrConflict)
}

// Chunks outside the manifest are ErrInvalid. Reference: PROTOCOL.md §5.7
func TestAssemblerRejectsOutOfRange(t *testing.T) {
	m := envelope.Manifest{TotalLength: 10, ChunkCount: 2, ChecksumCRC32C: envelope.Checksum(make([]byte, 10))}
	a, err := envelope.NewAssembler(m, 10)
	require.NoError(t, err)
	for _, c := range []envelope.Chunk{
		{Index: 2, Offset: 0, Data: []byte{0}},
		{Index: 0, Offset: 0, Data: nil},
		{Index: 0, Offset: 0, Data: []byte{}},
		{Index: 0, Offset: 10, Data: []byte{0}},
		{Index: 0, Offset: 5, Data: make([]byte, 6)},
		{Index: 0, Offset: 1<<64 - 1, Data: []byte{0}},
		{Index: 1, Offset: 0, Data: make([]byte, 11)},
	} {
		require.ErrorIs(t, a.Add(c), envelope.ErrInvalid, "%+v", c)
	}
	require.NoError(t, a.Add(envelope.Chunk{Index: 1, Offset: 5, Data: make([]byte, 5)}))
	require.NoError(t, a.Add(envelope.Chunk{Index: 0, Offset: 0, Data: make([]byte, 5)}))
	got, err := a.Bytes()
	require.NoError(t, err)
	require.Equal(t, make([]byte, 10), got)
}

// Manifests that cannot describe a stream, or a larger one than the caller
// accepts, are refused. Reference: PROTOCOL.md §5.6 (MaxPayloadLength), §5.7
func TestNewAssemblerRejects(t *testing.T) {
	for _, m := range []envelope.Manifest{
		{TotalLength: 0, ChunkCount: 1},
		{TotalLength: 101, ChunkCount: 1},
		{TotalLength: 10, ChunkCount: 0},
		{TotalLength: 10, ChunkCount: 11},
		{TotalLength: 1<<64 - 1, ChunkCount: 1},
	} {
		a, err := envelope.NewAssembler(m, 100)
		require.ErrorIs(t, err, envelope.ErrInvalid, "%+v", m)
		require.Nil(t, a)
	}
	_, err := envelope.NewAssembler(envelope.Manifest{TotalLength: 100, ChunkCount: 100}, 100)
	require.NoError(t, err)
}

// A flipped byte is an explicit checksum failure: Bytes returns no bytes,
// never the damaged payload. Reference: PROTOCOL.md §5.7
func TestAssemblerChecksumMismatch(t *testing.T) {
	stream := fullStream(t)
	m, chunks, err := envelope.Split(stream, 64)
	require.NoError(t, err)
	a, err := envelope.NewAssembler(m, 1<<20)
	require.NoError(t, err)
	for i, c := range chunks {
		if i == 2 {
			d := bytes.Clone(c.Data)
			d[10] ^= 0x01
			c.Data = d
		}
		require.NoError(t, a.Add(c))
	}
	require.True(t, a.Complete())
	got, err := a.Bytes()
	require.ErrorIs(t, err, envelope.ErrChecksumMismatch)
	require.Nil(t, got)

	wrongSum := m
	wrongSum.ChecksumCRC32C ^= 1
	a, err = envelope.NewAssembler(wrongSum, 1<<20)
	require.NoError(t, err)
	for _, c := range chunks {
		require.NoError(t, a.Add(c))
	}
	got, err = a.Bytes()
	require.ErrorIs(t, err, envelope.ErrChecksumMismatch)
	require.Nil(t, got)
}

// A manifest whose TotalLength the chunks do not make up, missing chunks,
// and a chunk count the chunks do not reach all fail explicitly: no
// partial, truncated or padded payload. Reference: PROTOCOL.md §5.7
func TestAssemblerLengthMismatch(t *testing.T) {
	stream := fullStream(t)
	m, chunks, err := envelope.Split(stream, 64)
	require.NoError(t, err)

	tooLong := m
	tooLong.TotalLength++
	a, err := envelope.NewAssembler(tooLong, 1<<20)
	require.NoError(t, err)
	for _, c := range chunks {
		require.NoError(t, a.Add(c))
	}
	require.False(t, a.Complete())
	got, err := a.Bytes()
	require.ErrorIs(t, err, envelope.ErrLengthMismatch)
	require.Nil(t, got)

	tooShort := m
	tooShort.TotalLength--
	a, err = envelope.NewAssembler(tooShort, 1<<20)
	require.NoError(t, err)
	for _, c := range chunks[:len(chunks)-1] {
		require.NoError(t, a.Add(c))
	}
	require.ErrorIs(t, a.Add(chunks[len(chunks)-1]), envelope.ErrInvalid)
	got, err = a.Bytes()
	require.ErrorIs(t, err, envelope.ErrLengthMismatch)
	require.Nil(t, got)

	moreChunks := m
	moreChunks.ChunkCount++
	a, err = envelope.NewAssembler(moreChunks, 1<<20)
	require.NoError(t, err)
	for _, c := range chunks {
		require.NoError(t, a.Add(c))
	}
	require.False(t, a.Complete())
	_, err = a.Bytes()
	require.ErrorIs(t, err, envelope.ErrLengthMismatch)

	a, err = envelope.NewAssembler(m, 1<<20)
	require.NoError(t, err)
	got, err = a.Bytes()
	require.ErrorIs(t, err, envelope.ErrLengthMismatch, "nothing received")
	require.Nil(t, got)
	for _, c := range chunks[1:] {
		require.NoError(t, a.Add(c))
	}
	require.False(t, a.Complete())
	got, err = a.Bytes()
	require.ErrorIs(t, err, envelope.ErrLengthMismatch, "first chunk missing")
	require.Nil(t, got)
}

// The Assembler copies chunk data: changing the caller's slices after Add,
// or the slice Bytes returned, does not change the payload.
// Reference: PROTOCOL.md §5.7
func TestAssemblerDoesNotAlias(t *testing.T) {
	stream := fullStream(t)
	source := bytes.Clone(stream)
	m, chunks, err := envelope.Split(source, 7)
	require.NoError(t, err)
	a, err := envelope.NewAssembler(m, 1<<20)
	require.NoError(t, err)
	for _, c := range chunks {
		require.NoError(t, a.Add(c))
		for i := range c.Data {
			c.Data[i] = 0
		}
	}
	got, err := a.Bytes()
	require.NoError(t, err)
	require.Equal(t, stream, got)
	got[0] ^= 0xff
	again, err := a.Bytes()
	require.NoError(t, err)
	require.Equal(t, stream, again)
}

// Take hands the assembled payload over once, checked like Bytes, and
// leaves the assembler empty.
// Reference: PROTOCOL.md §5.7 (never a partial or repaired payload).
func TestAssemblerTakeHandsOverOnce(t *testing.T) {
	stream := fullStream(t)
	m, chunks, err := envelope.Split(bytes.Clone(stream), 7)
	require.NoError(t, err)
	a, err := envelope.NewAssembler(m, 1<<20)
	require.NoError(t, err)
	_, err = a.Take()
	require.ErrorIs(t, err, envelope.ErrLengthMismatch, "not complete yet")
	for _, c := range chunks {
		require.NoError(t, a.Add(c))
	}
	got, err := a.Take()
	require.NoError(t, err)
	require.Equal(t, stream, got)
}
