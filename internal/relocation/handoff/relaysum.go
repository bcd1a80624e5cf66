package handoff

import (
	"encoding/binary"
	"hash/crc32"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// RelaySum is the count and CRC-32C of a boundary relay batch, as the
// cutover carries them (docs/PROTOCOL.md §5.9). The CRC covers, for each record in
// order, its length as a big-endian u32 followed by its bytes (the
// deterministic protobuf encoding of the relayed Envelope).
type RelaySum struct {
	Count uint64
	CRC   uint32
}

// Add folds one record into the sum.
func (s RelaySum) Add(record []byte) RelaySum {
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(record)))
	s.CRC = crc32.Update(s.CRC, castagnoli, n[:])
	s.CRC = crc32.Update(s.CRC, castagnoli, record)
	s.Count++
	return s
}
