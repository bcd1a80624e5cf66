// Package checkpoint decides and writes the checkpoints of relocatable
// objects (docs/FAULTS.md, "Checkpoints and recovery"): what a checkpoint
// holds and how it is encoded, which of two checkpoints wins (Fence), when
// an owner captures its object's state (Policy), and the node's Writer
// that stores captures off the dispatch path, fenced by compare-and-set on
// a location.CheckpointStore.
//
// The decisions are pure functions of their inputs (time included); the
// Writer only executes them.
package checkpoint

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"unicode/utf8"

	"github.com/roamactors/roam/roamerr"
)

// Fence orders the checkpoints of one object. An incarnation writes its
// checkpoints with its ObjectGeneration and AuthorityOwnerGeneration and a
// Sequence that grows with each of its captures; a move's target has the
// next owner generation, and a recovered incarnation a new object
// generation or owner generation, so their checkpoints order after every
// checkpoint of the incarnation they replaced. A write whose fence is not
// above the stored one is superseded: a late write of an ended or
// moved-away incarnation never replaces a newer checkpoint.
type Fence struct {
	ObjectGeneration uint64
	OwnerGeneration  uint64
	Sequence         uint64
}

// Less reports whether f orders before g.
func (f Fence) Less(g Fence) bool {
	if f.ObjectGeneration != g.ObjectGeneration {
		return f.ObjectGeneration < g.ObjectGeneration
	}
	if f.OwnerGeneration != g.OwnerGeneration {
		return f.OwnerGeneration < g.OwnerGeneration
	}
	return f.Sequence < g.Sequence
}

func (f Fence) String() string {
	return fmt.Sprintf("%d/%d/%d", f.ObjectGeneration, f.OwnerGeneration, f.Sequence)
}

// Checkpoint is one captured state of an object.
type Checkpoint struct {
	Fence Fence
	// StableType and ApplicationVersion of the kind that captured it: a
	// node restores only a checkpoint of the type it activates.
	StableType         string
	ApplicationVersion string
	// TakenUnixNanos is when the owner captured it (wall clock: for
	// operators; nothing is decided by it).
	TakenUnixNanos int64
	// NoState: a recovery's claim over an object that had no checkpoint
	// (it fences out late writes; the incarnation starts from its
	// producer). State is then empty.
	NoState bool
	// State is what the kind's policy captured (StateAdapter.Capture).
	State []byte
}

// Encoding (version 1), big-endian, in this order:
//
//	magic "RCKP", version u8 = 1, flags u8 (bit 0: NoState),
//	object generation u64, owner generation u64, sequence u64,
//	taken unix nanos i64,
//	stable type (u16 length, UTF-8), application version (u16 length, UTF-8),
//	state (u32 length, bytes),
//	CRC-32C (Castagnoli) of everything before it, u32.
const (
	magic   = "RCKP"
	version = 1
	flagNo  = 1
	fixed   = 4 + 1 + 1 + 8*3 + 8 + 2 + 2 + 4 + 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrCorrupt: stored bytes that are no checkpoint (bad magic, version,
// lengths or checksum). Nothing of them is restored.
var ErrCorrupt = fmt.Errorf("%w: corrupt checkpoint", roamerr.ErrInvalidOperation)

// ErrNewerFormat: an intact checkpoint of a later format than this node
// reads, written by a newer node. It is neither restored nor replaced.
var ErrNewerFormat = fmt.Errorf("%w: checkpoint of a newer format", roamerr.ErrUnavailable)

// Encode returns c's bytes.
func Encode(c Checkpoint) ([]byte, error) {
	switch {
	case len(c.StableType) > 0xffff || !utf8.ValidString(c.StableType):
		return nil, fmt.Errorf("%w: checkpoint stable type", roamerr.ErrInvalidOperation)
	case len(c.ApplicationVersion) > 0xffff || !utf8.ValidString(c.ApplicationVersion):
		return nil, fmt.Errorf("%w: checkpoint application version", roamerr.ErrInvalidOperation)
	case uint64(len(c.State)) > 0xffffffff:
		return nil, fmt.Errorf("%w: checkpoint state of %d bytes", roamerr.ErrCapacityExceeded, len(c.State))
	case c.NoState && len(c.State) > 0:
		return nil, fmt.Errorf("%w: a NoState checkpoint with state", roamerr.ErrInvalidOperation)
	}
	b := make([]byte, 0, fixed+len(c.StableType)+len(c.ApplicationVersion)+len(c.State))
	b = append(b, magic...)
	var flags byte
	if c.NoState {
		flags |= flagNo
	}
	b = append(b, version, flags)
	b = binary.BigEndian.AppendUint64(b, c.Fence.ObjectGeneration)
	b = binary.BigEndian.AppendUint64(b, c.Fence.OwnerGeneration)
	b = binary.BigEndian.AppendUint64(b, c.Fence.Sequence)
	b = binary.BigEndian.AppendUint64(b, uint64(c.TakenUnixNanos))
	b = binary.BigEndian.AppendUint16(b, uint16(len(c.StableType)))
	b = append(b, c.StableType...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(c.ApplicationVersion)))
	b = append(b, c.ApplicationVersion...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(c.State)))
	b = append(b, c.State...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli)), nil
}

// Decode parses bytes Encode made; anything else is ErrCorrupt. The
// state aliases b.
func Decode(b []byte) (Checkpoint, error) {
	var c Checkpoint
	if len(b) < fixed {
		return c, fmt.Errorf("%w: %d bytes", ErrCorrupt, len(b))
	}
	body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return c, fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
	}
	if string(body[:4]) == magic && (body[4] > version || body[5]&^flagNo != 0) {
		// Intact, of a later format: a newer node's (a rolling upgrade).
		return c, fmt.Errorf("%w: format %d, flags %#x (this node reads format %d)", ErrNewerFormat, body[4], body[5], version)
	}
	if string(body[:4]) != magic || body[4] != version {
		return c, fmt.Errorf("%w: not a version %d checkpoint", ErrCorrupt, version)
	}
	c.NoState = body[5]&flagNo != 0
	r := body[6:]
	c.Fence.ObjectGeneration = binary.BigEndian.Uint64(r)
	c.Fence.OwnerGeneration = binary.BigEndian.Uint64(r[8:])
	c.Fence.Sequence = binary.BigEndian.Uint64(r[16:])
	c.TakenUnixNanos = int64(binary.BigEndian.Uint64(r[24:]))
	r = r[32:]
	var err error
	if c.StableType, r, err = str16(r); err != nil {
		return Checkpoint{}, err
	}
	if c.ApplicationVersion, r, err = str16(r); err != nil {
		return Checkpoint{}, err
	}
	if len(r) < 4 || uint64(len(r)-4) != uint64(binary.BigEndian.Uint32(r)) {
		return Checkpoint{}, fmt.Errorf("%w: state length", ErrCorrupt)
	}
	c.State = r[4:]
	if c.NoState && len(c.State) > 0 {
		return Checkpoint{}, fmt.Errorf("%w: a NoState checkpoint with state", ErrCorrupt)
	}
	return c, nil
}

func str16(r []byte) (string, []byte, error) {
	if len(r) < 2 {
		return "", nil, fmt.Errorf("%w: truncated", ErrCorrupt)
	}
	n := int(binary.BigEndian.Uint16(r))
	if len(r) < 2+n || !utf8.Valid(r[2:2+n]) {
		return "", nil, fmt.Errorf("%w: string", ErrCorrupt)
	}
	return string(r[2 : 2+n]), r[2+n:], nil
}

// Verdict is what a writer does with its capture, given the stored one.
type Verdict int

const (
	// Write: the capture is above the stored checkpoint (or none is
	// stored): compare-and-set it at the version read.
	Write Verdict = iota
	// Superseded: the stored checkpoint is at or above the capture (a
	// later incarnation, or a later capture of this one): drop it.
	Superseded
	// Unreadable: the stored bytes are corrupt. The capture replaces
	// them (an owner's current state is the best checkpoint there is);
	// logged.
	Unreadable
)

// Judge decides what a capture with fence mine does over stored (nil: none
// stored; decodeErr: stored bytes that did not decode).
func Judge(mine Fence, stored *Checkpoint, decodeErr error) Verdict {
	switch {
	case decodeErr != nil:
		return Unreadable
	case stored == nil, stored.Fence.Less(mine):
		return Write
	}
	return Superseded
}

// IsCorrupt reports an ErrCorrupt.
func IsCorrupt(err error) bool { return errors.Is(err, ErrCorrupt) }
