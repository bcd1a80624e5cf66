package envelope

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"math"
	"sort"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checksum returns the CRC-32C (Castagnoli) of the whole stream, the value
// a Manifest carries (docs/PROTOCOL.md §5.6).
func Checksum(stream []byte) uint32 {
	return crc32.Checksum(stream, castagnoli)
}

// Manifest announces a chunked stream: its length in bytes, how many
// chunks carry it, and the CRC-32C of the whole stream.
type Manifest struct {
	TotalLength    uint64
	ChunkCount     uint32
	ChecksumCRC32C uint32
}

// Chunk is one piece of a stream: Data is the stream's bytes
// [Offset, Offset+len(Data)), and Index is the chunk's number in
// [0, ChunkCount).
type Chunk struct {
	Index  uint32
	Offset uint64
	Data   []byte
}

// Split cuts stream into chunks of exactly chunkLimit bytes, the last one
// possibly shorter, and returns the manifest describing them
// (PROTOCOL.md §5.6). An empty stream, a chunkLimit below 1 or more than 2^32-1 chunks
// is ErrInvalid. The chunks' Data alias stream.
func Split(stream []byte, chunkLimit int) (Manifest, []Chunk, error) {
	if len(stream) == 0 {
		return Manifest{}, nil, fmt.Errorf("%w: empty stream", ErrInvalid)
	}
	if chunkLimit < 1 {
		return Manifest{}, nil, fmt.Errorf("%w: chunk limit %d, want >= 1", ErrInvalid, chunkLimit)
	}
	n := (len(stream)-1)/chunkLimit + 1
	if uint64(n) > math.MaxUint32 {
		return Manifest{}, nil, fmt.Errorf("%w: %d chunks, at most 4294967295", ErrInvalid, n)
	}
	chunks := make([]Chunk, n)
	for i := range chunks {
		start := i * chunkLimit
		end := min(start+chunkLimit, len(stream))
		chunks[i] = Chunk{Index: uint32(i), Offset: uint64(start), Data: stream[start:end:end]}
	}
	m := Manifest{TotalLength: uint64(len(stream)), ChunkCount: uint32(n), ChecksumCRC32C: Checksum(stream)}
	return m, chunks, nil
}

// Assembler rebuilds one stream from its chunks under the rules of
// PROTOCOL.md §5.7: any chunk boundaries, any arrival order, identical duplicates
// ignored, contradictions rejected, and the payload released only when it
// is complete and both its length and its CRC-32C match the manifest.
//
// One Assembler serves one relocation attempt; routing chunks to it by
// relocation identity is the caller's job. Besides the TotalLength-byte
// buffer it keeps a few dozen bytes of bookkeeping per accepted chunk, so a
// caller bounding memory bounds ChunkCount as well as TotalLength. An
// Assembler is not safe for concurrent use.
type Assembler struct {
	m        Manifest
	buf      []byte            // allocated on the first accepted chunk
	byIndex  map[uint32]extent // accepted chunks by index
	ranges   []extent          // accepted ranges sorted by offset, disjoint
	received uint64            // bytes accepted; ranges are disjoint
}

// extent is the byte range [off, end) of an accepted chunk.
type extent struct {
	off, end uint64
	index    uint32
}

// NewAssembler prepares to assemble the stream m describes. maxTotal is the
// largest stream the caller accepts; a TotalLength of 0 or above maxTotal,
// a ChunkCount of 0, or more chunks than bytes is ErrInvalid.
func NewAssembler(m Manifest, maxTotal uint64) (*Assembler, error) {
	switch {
	case m.TotalLength == 0:
		return nil, fmt.Errorf("%w: manifest total length 0", ErrInvalid)
	case m.TotalLength > maxTotal:
		return nil, fmt.Errorf("%w: manifest total length %d over the limit %d", ErrInvalid, m.TotalLength, maxTotal)
	case m.TotalLength > math.MaxInt:
		return nil, fmt.Errorf("%w: manifest total length %d does not fit in memory", ErrInvalid, m.TotalLength)
	case m.ChunkCount == 0:
		return nil, fmt.Errorf("%w: manifest chunk count 0", ErrInvalid)
	case uint64(m.ChunkCount) > m.TotalLength:
		return nil, fmt.Errorf("%w: manifest has %d chunks for %d bytes", ErrInvalid, m.ChunkCount, m.TotalLength)
	}
	return &Assembler{m: m, byIndex: make(map[uint32]extent)}, nil
}

// Add accepts one chunk, copying its data; the caller may reuse c.Data
// afterwards. An index >= ChunkCount, an empty chunk or a range running past
// TotalLength is ErrInvalid. A chunk whose index was already received is a
// no-op if its offset and bytes are identical and ErrConflict otherwise; a
// range overlapping another index's range is ErrConflict. A rejected chunk
// leaves the Assembler unchanged.
func (a *Assembler) Add(c Chunk) error {
	n := uint64(len(c.Data))
	switch {
	case c.Index >= a.m.ChunkCount:
		return fmt.Errorf("%w: chunk index %d, manifest has %d chunks", ErrInvalid, c.Index, a.m.ChunkCount)
	case n == 0:
		return fmt.Errorf("%w: chunk %d is empty", ErrInvalid, c.Index)
	case c.Offset > a.m.TotalLength || n > a.m.TotalLength-c.Offset:
		return fmt.Errorf("%w: chunk %d covers [%d, %d), past the total length %d", ErrInvalid, c.Index, c.Offset, c.Offset+n, a.m.TotalLength)
	}
	end := c.Offset + n
	if prev, ok := a.byIndex[c.Index]; ok {
		if prev.off == c.Offset && prev.end == end && bytes.Equal(a.buf[prev.off:prev.end], c.Data) {
			return nil
		}
		return fmt.Errorf("%w: chunk %d received again with other offset or bytes ([%d, %d) before, [%d, %d) now)",
			ErrConflict, c.Index, prev.off, prev.end, c.Offset, end)
	}
	// ranges is sorted by offset and disjoint: only the neighbours of the
	// insertion point can overlap [c.Offset, end).
	i := sort.Search(len(a.ranges), func(k int) bool { return a.ranges[k].off >= c.Offset })
	if i > 0 && a.ranges[i-1].end > c.Offset {
		o := a.ranges[i-1]
		return fmt.Errorf("%w: chunk %d [%d, %d) overlaps chunk %d [%d, %d)", ErrConflict, c.Index, c.Offset, end, o.index, o.off, o.end)
	}
	if i < len(a.ranges) && a.ranges[i].off < end {
		o := a.ranges[i]
		return fmt.Errorf("%w: chunk %d [%d, %d) overlaps chunk %d [%d, %d)", ErrConflict, c.Index, c.Offset, end, o.index, o.off, o.end)
	}
	if a.buf == nil {
		a.buf = make([]byte, a.m.TotalLength)
	}
	copy(a.buf[c.Offset:end], c.Data)
	x := extent{off: c.Offset, end: end, index: c.Index}
	a.ranges = append(a.ranges, extent{})
	copy(a.ranges[i+1:], a.ranges[i:])
	a.ranges[i] = x
	a.byIndex[c.Index] = x
	a.received += n
	return nil
}

// Complete reports whether every chunk index has arrived and the chunks
// cover [0, TotalLength) exactly. A complete payload may still fail its
// checksum in Bytes.
func (a *Assembler) Complete() bool {
	return uint64(len(a.byIndex)) == uint64(a.m.ChunkCount) && a.received == a.m.TotalLength
}

// Bytes returns a copy of the assembled stream, only if it is complete and
// its length and CRC-32C match the manifest. Otherwise it returns no bytes
// and an error wrapping ErrLengthMismatch (chunks missing, gaps, or a
// manifest whose TotalLength the chunks do not make up) or
// ErrChecksumMismatch; it never returns a partial or repaired payload
// (PROTOCOL.md §5.7).
func (a *Assembler) Bytes() ([]byte, error) {
	if !a.Complete() {
		return nil, fmt.Errorf("%w: received %d of %d chunks covering %d of %d bytes",
			ErrLengthMismatch, len(a.byIndex), a.m.ChunkCount, a.received, a.m.TotalLength)
	}
	if sum := Checksum(a.buf); sum != a.m.ChecksumCRC32C {
		return nil, fmt.Errorf("%w: assembled CRC-32C 0x%08x, manifest 0x%08x", ErrChecksumMismatch, sum, a.m.ChecksumCRC32C)
	}
	return bytes.Clone(a.buf), nil
}

// Take is Bytes for the assembler's last use: it hands over the assembled
// payload without copying it and empties the assembler.
func (a *Assembler) Take() ([]byte, error) {
	if !a.Complete() {
		return a.Bytes()
	}
	if sum := Checksum(a.buf); sum != a.m.ChecksumCRC32C {
		return nil, fmt.Errorf("%w: assembled CRC-32C 0x%08x, manifest 0x%08x", ErrChecksumMismatch, sum, a.m.ChecksumCRC32C)
	}
	b := a.buf
	a.buf = nil
	return b, nil
}
