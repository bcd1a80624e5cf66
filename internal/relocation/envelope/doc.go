// Package envelope implements relocation-envelope-v1, the payload a source
// node sends to a target node when an actor relocates, and the chunking,
// assembly and checksum rules that carry it (docs/PROTOCOL.md §5.6, §5.7).
//
// The format is a canonical field stream: one Envelope has exactly one
// encoding, so any runtime, in any language, that follows this comment
// produces the same bytes. Golden fixtures with a byte-by-byte description
// live in testdata/ (minimal.bin/.md, full.bin/.md).
//
// # Primitives
//
// Every integer is unsigned and big-endian (network byte order).
//
//	u8, u16, u32, u64   1, 2, 4 and 8 bytes
//	text8               u8 length L, then L bytes of valid UTF-8 (L <= 255)
//	text16              u16 length L, then L bytes of valid UTF-8 (L <= 65535)
//	bytes32             u32 length L, then L raw bytes
//	optional<T>         u8 presence: 0x00 = absent, nothing follows;
//	                    0x01 = present, T follows; any other value is malformed
//	vector<T>           u32 element count N, then N encodings of T back to back
//
// Lengths count bytes, not characters. "Valid UTF-8" is RFC 3629 UTF-8: no
// overlong forms, no surrogates (U+D800..U+DFFF), nothing above U+10FFFF.
// Text is never normalized; text is compared and sorted as raw bytes
// (unsigned, lexicographic, a proper prefix sorts first).
//
// There is no magic number, no version field, no padding or alignment, no
// terminator and no checksum inside the stream: the stream is exactly the
// fields below, in this order, and it ends where the last field ends. Bytes
// left over after pendingTimerTicks make the stream malformed.
//
// # Field order
//
// Structures are the concatenation of their fields, in this order:
//
//	Envelope
//	  relocation                Relocation
//	  object                    Object
//	  applicationVersion        text8
//	  applicationStates         vector<ApplicationState>
//	  savedWork                 vector<SavedWork>
//	  timerRegistrations        vector<TimerRegistration>
//	  pendingTimerTicks         vector<PendingTimerTick>
//
//	Relocation
//	  relocationId              u64
//	  targetAttemptGeneration   u64
//	  coordinatorFence          Fence
//
//	Fence
//	  nodeRid                   text8
//	  nodeGeneration            u64
//	  ownerGeneration           u64
//
//	Object
//	  kind                      u8
//	  id                        text8, 1..255 bytes
//	  objectGeneration          u64
//	  stableType                text8, 1..255 bytes
//
//	ApplicationState
//	  participantId             u32, >= 1
//	  state                     bytes32
//
//	SavedWork
//	  participantId             u32, >= 1
//	  order                     u64
//	  record                    Record
//
//	Record
//	  kind                      u8: 1 = send, 2 = request; nothing else
//	  source                    optional<PID> (the original sender)
//	  metadata                  vector<Header>
//	  operationId               text8 (may be empty)
//	  operationKind             u8
//	  replyRoute                optional<PID>
//	  deadlineUnixMillis        u64, 0 = no deadline
//	  messageType               text16, non-empty (protobuf full message name)
//	  body                      bytes32
//
//	PID
//	  address                   text16
//	  id                        text16
//
//	Header
//	  key                       text16
//	  value                     text16
//
//	TimerRegistration
//	  participantId             u32, >= 1
//	  name                      text8, non-empty
//	  handlerType               text16
//	  periodMillis              u64
//	  overrunPolicy             u8
//	  catchUpLimit              u32
//	  unhandledExceptionPolicy  u8
//	  completedDeliveryIndex    u64
//	  completedScheduleIndex    u64
//	  nextScheduleUnixMillis    u64
//
//	PendingTimerTick
//	  participantId             u32, >= 1
//	  order                     u64
//	  name                      text8
//	  deliveryIndex             u64
//	  scheduledIndex            u64
//	  scheduledUnixMillis       u64
//	  skippedTicks              u32
//
// u8 fields without a listed range (object.kind, operationKind,
// overrunPolicy, unhandledExceptionPolicy) accept every value at this
// layer; their meaning belongs to the layers that produce them.
//
// # Ordering and uniqueness
//
// Vectors are in strictly increasing order of their key, which makes every
// key unique and the encoding canonical:
//
//	applicationStates    participantId
//	savedWork            (participantId, order)
//	timerRegistrations   (participantId, name as bytes)
//	pendingTimerTicks    (participantId, order)
//	record.metadata      key as bytes
//
// Tuples compare field by field, left to right. A writer must refuse to
// emit a stream that breaks a rule (Encode returns ErrInvalid); a reader
// must reject such a stream (Decode returns ErrMalformed). Every rule of
// this comment is checked on both sides, so a stream Decode accepts
// re-encodes to exactly the same bytes.
//
// # Hostile input
//
// A reader must check every length and count against the bytes that remain
// before allocating. An element of each vector has a minimum encoded size
// (all texts and bytes empty, all optionals absent, all vectors empty):
//
//	ApplicationState     8 bytes
//	SavedWork           35 bytes (12 + Record)
//	Record              23 bytes
//	Header               4 bytes
//	TimerRegistration   45 bytes
//	PendingTimerTick    41 bytes
//
// A count N whose N x minimum exceeds the remaining bytes is malformed and
// is rejected before anything is allocated; so is a text or bytes32 length
// beyond the remaining bytes. Decoded memory therefore stays proportional
// to the input length.
//
// # Checksum
//
// The checksum is CRC-32C (Castagnoli: polynomial 0x1EDC6F41, reflected
// 0x82F63B78, initial value 0xFFFFFFFF, final XOR 0xFFFFFFFF, as in iSCSI,
// RFC 3720) over the whole stream, from its first to its last byte. Its
// check value is CRC-32C("123456789") = 0xE3069283. The checksum travels in
// the Manifest, not in the stream.
//
// # Chunking
//
// A stream is never empty (object.id is at least one byte). It is split at
// any byte boundary, without regard to field boundaries, into chunks that
// each carry (index, offset, data). Split cuts every chunkLimit bytes:
// chunk i covers [i*chunkLimit, min((i+1)*chunkLimit, totalLength)), so
// every chunk but the last has exactly chunkLimit bytes. The Manifest
// announces totalLength (u64 bytes), chunkCount (u32) and checksumCrc32c
// (u32) of the whole stream.
//
// A receiver does not assume uniform chunks: any sender's boundaries are
// accepted (PROTOCOL.md §5.7), as long as
//
//   - every index is < chunkCount, every chunk has at least one byte, and
//     its range [offset, offset+len) lies inside [0, totalLength);
//   - a second chunk with an index already received is accepted as a no-op
//     only if its offset and bytes are identical, and is otherwise a
//     conflict (ErrConflict);
//   - ranges of different indexes never overlap (ErrConflict);
//   - the payload is complete when every index in [0, chunkCount) has
//     arrived and the ranges cover [0, totalLength) exactly.
//
// The assembled stream is released only when it is complete, its length
// equals totalLength and its CRC-32C equals checksumCrc32c. Any mismatch is
// an explicit failure (ErrLengthMismatch, ErrChecksumMismatch); a partial,
// truncated, padded or otherwise repaired payload is never returned
// (PROTOCOL.md §5.7). The Assembler copies chunk data into its own buffer and
// never keeps a caller's slice.
//
// Chunks are attributed to a relocation only by relocation identity, and
// that is the caller's job (PROTOCOL.md §5.7): this package never looks inside
// a chunk, so the caller must route each chunk and manifest to the
// Assembler of the relocation attempt they belong to and keep one Assembler
// per attempt.
//
// # Go representation
//
// Decode returns nil, not empty, slices for empty vectors and empty bytes32
// fields, and byte slices that never alias its input; Encode treats nil and
// empty alike. Strings and slices that break a rule above make Encode fail
// with ErrInvalid rather than being truncated.
package envelope
