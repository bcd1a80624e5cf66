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
	// In steps: the CRC's assembly cannot be preempted, and one call over
	// 16 MiB would hold a processor for milliseconds that other actors'
	// goroutines wait through.
	var crc uint32
	for len(stream) > checksumStep {
		crc = crc32.Update(crc, castagnoli, stream[:checksumStep])
		stream = stream[checksumStep:]
	}
	return crc32.Update(crc, castagnoli, stream)
}

const checksumStep = 256 << 10

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
	// Backing, when set, is a buffer of the whole stream's length that
	// Data lies in at Offset (the chunk link reads a move's chunks into
	// one): an Assembler given such chunks keeps that buffer instead of
	// copying them. Whoever fills it writes each byte once, before the
	// chunk holding it is added, and never again.
	Backing []byte
}

// inPlace reports whether c's data lies at its offset in its Backing.
func (c *Chunk) inPlace() bool {
	n := uint64(len(c.Data))
	return n > 0 && c.Offset < uint64(len(c.Backing)) && n <= uint64(len(c.Backing))-c.Offset &&
		&c.Backing[c.Offset] == &c.Data[0]
}

// Split cuts stream into chunks of exactly chunkLimit bytes, the last one
// possibly shorter, and returns the manifest describing them
// (PROTOCOL.md §5.6). An empty stream, a chunkLimit below 1 or more than 2^32-1 chunks
// is ErrInvalid. The chunks' Data alias stream.
func Split(stream []byte, chunkLimit int) (Manifest, []Chunk, error) {
	return SplitStream(Whole(stream), chunkLimit)
}

// Stream is an encoded stream held as pieces in order (EncodeStream):
// its bytes are the pieces one after another.
type Stream struct {
	pieces [][]byte
	n      int
}

// Whole is the Stream of one buffer.
func Whole(b []byte) Stream {
	if len(b) == 0 {
		return Stream{}
	}
	return Stream{pieces: [][]byte{b}, n: len(b)}
}

// Len is the stream's length in bytes.
func (s Stream) Len() int { return s.n }

// Bytes is the stream in one buffer: its only piece, or a copy of all.
func (s Stream) Bytes() []byte {
	if len(s.pieces) == 1 {
		return s.pieces[0]
	}
	out := make([]byte, 0, s.n)
	for _, p := range s.pieces {
		out = append(out, p...)
	}
	return out
}

// SplitStream is Split of a Stream held in pieces: a chunk within one
// piece is a slice of it, and only a chunk across pieces is copied.
func SplitStream(stream Stream, chunkLimit int) (Manifest, []Chunk, error) {
	if stream.n == 0 {
		return Manifest{}, nil, fmt.Errorf("%w: empty stream", ErrInvalid)
	}
	if chunkLimit < 1 {
		return Manifest{}, nil, fmt.Errorf("%w: chunk limit %d, want >= 1", ErrInvalid, chunkLimit)
	}
	n := (stream.n-1)/chunkLimit + 1
	if uint64(n) > math.MaxUint32 {
		return Manifest{}, nil, fmt.Errorf("%w: %d chunks, at most 4294967295", ErrInvalid, n)
	}
	chunks := make([]Chunk, n)
	var crc uint32
	piece, at := 0, 0 // the piece holding the next byte, and that byte's position in it
	for i := range chunks {
		start := i * chunkLimit
		size := min(chunkLimit, stream.n-start)
		var data []byte
		if p := stream.pieces[piece]; len(p)-at >= size {
			data = p[at : at+size : at+size]
			at += size
		} else {
			data = make([]byte, 0, size)
			for len(data) < size {
				p := stream.pieces[piece]
				k := min(size-len(data), len(p)-at)
				data = append(data, p[at:at+k]...)
				at += k
				if at == len(p) && len(data) < size {
					piece, at = piece+1, 0
				}
			}
		}
		if at == len(stream.pieces[piece]) && piece+1 < len(stream.pieces) {
			piece, at = piece+1, 0
		}
		crc = crc32.Update(crc, castagnoli, data)
		chunks[i] = Chunk{Index: uint32(i), Offset: uint64(start), Data: data}
	}
	m := Manifest{TotalLength: uint64(stream.n), ChunkCount: uint32(n), ChecksumCRC32C: crc}
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
	m   Manifest
	buf []byte // allocated (or adopted) on the first accepted chunk
	// adopted: buf is the Backing of the chunks added so far, which are
	// already in place in it.
	adopted  bool
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
	inPlace := c.inPlace() && uint64(len(c.Backing)) == a.m.TotalLength
	switch {
	case a.buf == nil && inPlace:
		a.buf, a.adopted = c.Backing, true
	case a.buf == nil:
		a.buf = make([]byte, a.m.TotalLength)
	case a.adopted && !(inPlace && &c.Backing[0] == &a.buf[0]):
		// A chunk from elsewhere (a resend on the other connection): the
		// buffer becomes the assembler's own, as its filler may still
		// write the parts not received yet.
		own := make([]byte, len(a.buf))
		for _, r := range a.ranges {
			copy(own[r.off:r.end], a.buf[r.off:r.end])
		}
		a.buf, a.adopted = own, false
	}
	if !a.adopted {
		copy(a.buf[c.Offset:end], c.Data)
	}
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
