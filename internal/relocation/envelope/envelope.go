package envelope

import "errors"

// FormatName names the wire format this package reads and writes.
const FormatName = "relocation-envelope-v1"

// The error classes of this package; match them with errors.Is.
var (
	// ErrInvalid: a caller-supplied value breaks a rule (Encode, Split,
	// NewAssembler, Assembler.Add); nothing was produced or changed.
	ErrInvalid = errors.New("envelope: invalid")
	// ErrMalformed: a stream handed to Decode is not a canonical
	// relocation-envelope-v1 stream.
	ErrMalformed = errors.New("envelope: malformed stream")
	// ErrConflict: a chunk contradicts one already received (same index
	// with other offset or bytes, or a range overlapping another index).
	ErrConflict = errors.New("envelope: conflicting chunk")
	// ErrLengthMismatch: the assembled bytes do not make up exactly the
	// manifest's TotalLength (missing chunks, gaps, wrong manifest).
	ErrLengthMismatch = errors.New("envelope: length mismatch")
	// ErrChecksumMismatch: the assembled bytes do not have the manifest's
	// CRC-32C.
	ErrChecksumMismatch = errors.New("envelope: checksum mismatch")
)

// Fence is the coordinator fence of a relocation.
type Fence struct {
	NodeRid         string // text8
	NodeGeneration  uint64
	OwnerGeneration uint64
}

// Relocation identifies the relocation attempt the envelope belongs to.
type Relocation struct {
	RelocationID            uint64
	TargetAttemptGeneration uint64
	CoordinatorFence        Fence
}

// Object is the relocating object.
type Object struct {
	Kind             uint8
	ID               string // text8, 1..255 bytes
	ObjectGeneration uint64
	StableType       string // text8, 1..255 bytes
}

// ApplicationState is the opaque state of one participant.
type ApplicationState struct {
	ParticipantID uint32 // >= 1
	State         []byte // bytes32
}

// PID is an actor process identifier.
type PID struct {
	Address string // text16
	ID      string // text16
}

// Header is one metadata entry of a Record.
type Header struct {
	Key   string // text16
	Value string // text16
}

// RecordKind says whether a saved record is a send or a request.
type RecordKind uint8

// The record kinds; no other value is valid.
const (
	RecordSend    RecordKind = 1
	RecordRequest RecordKind = 2
)

// Record is one saved message.
type Record struct {
	Kind               RecordKind // u8, must be RecordSend or RecordRequest
	Source             *PID       // optional<PID>: the original sender
	Metadata           []Header   // vector<Header>, strictly sorted by Key bytes
	OperationID        string     // text8 (may be empty)
	OperationKind      uint8
	ReplyRoute         *PID   // optional<PID>
	DeadlineUnixMillis uint64 // 0 = none
	MessageType        string // text16, protobuf full message name, non-empty
	Body               []byte // bytes32
}

// SavedWork is one record a participant had accepted but not yet handled.
type SavedWork struct {
	ParticipantID uint32 // >= 1
	Order         uint64
	Record        Record
}

// TimerRegistration is one registered timer of a participant.
type TimerRegistration struct {
	ParticipantID            uint32 // >= 1
	Name                     string // text8, non-empty
	HandlerType              string // text16
	PeriodMillis             uint64
	OverrunPolicy            uint8
	CatchUpLimit             uint32
	UnhandledExceptionPolicy uint8
	CompletedDeliveryIndex   uint64
	CompletedScheduleIndex   uint64
	NextScheduleUnixMillis   uint64
}

// PendingTimerTick is one timer tick scheduled but not yet delivered.
type PendingTimerTick struct {
	ParticipantID       uint32 // >= 1
	Order               uint64
	Name                string // text8
	DeliveryIndex       uint64
	ScheduledIndex      uint64
	ScheduledUnixMillis uint64
	SkippedTicks        uint32
}

// Envelope is the whole relocation payload (docs/PROTOCOL.md §5.5, §5.6).
type Envelope struct {
	Relocation         Relocation
	Object             Object
	ApplicationVersion string              // text8
	ApplicationStates  []ApplicationState  // strictly sorted by ParticipantID
	SavedWork          []SavedWork         // strictly sorted by (ParticipantID, Order)
	TimerRegistrations []TimerRegistration // strictly sorted by (ParticipantID, Name bytes)
	PendingTimerTicks  []PendingTimerTick  // strictly sorted by (ParticipantID, Order)
}
