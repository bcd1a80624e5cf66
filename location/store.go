package location

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/roamactors/roam/messages"
)

// Record is the value of one authority key (docs/PROTOCOL.md §3.1).
type Record = messages.LocationRecord

// NodeDescriptor is what a node publishes about its lifecycle.
type NodeDescriptor = messages.NodeDescriptor

// StoreVersion orders the writes of one key: Consul's ModifyIndex in
// consulstore, a store-wide counter in memstore. 0 means absent.
type StoreVersion uint64

// Versioned is a record as read, with the version a CAS must name.
// Version 0 and a nil Record mean the key is absent (Missing).
type Versioned struct {
	Key     AuthorityKey
	Record  *Record
	Version StoreVersion
}

// Present reports whether the key exists.
func (v Versioned) Present() bool { return v.Version != 0 }

// VersionedNode is a node descriptor as read.
type VersionedNode struct {
	Node    *NodeDescriptor
	Version StoreVersion
}

// SortNodes orders descriptors by mesh, then node RID, the order ListNodes
// returns in every store.
func SortNodes(nodes []VersionedNode) {
	sort.Slice(nodes, func(i, j int) bool {
		a, b := nodes[i].Node, nodes[j].Node
		if a.GetMesh() != b.GetMesh() {
			return a.GetMesh() < b.GetMesh()
		}
		return a.GetNodeRid() < b.GetNodeRid()
	})
}

// LeaseID identifies an owner lease (a Consul session ID in consulstore).
type LeaseID string

// Lease is an owner lease: while it is renewed within TTL, the node claim
// it holds stays; when it ends, the store deletes the node descriptor and
// Entry claim it holds. A store may take up to 2×TTL to notice (Consul).
type Lease struct {
	ID  LeaseID
	TTL time.Duration
}

// Limits of the contract, the same for every store so that what works on
// memstore works on Consul (whose txn request is ≤ 512 KiB, PROTOCOL.md §3.6).
const (
	// MaxRecordBytes bounds one record's encoded size (EncodedSize).
	MaxRecordBytes = 256 << 10
	// MaxApplyOps bounds the operations of one Apply, as ApplyOpCount
	// counts them (a slot op may count twice).
	MaxApplyOps = 128
	// MaxApplyBytes bounds the encoded records plus IDs of one Apply.
	MaxApplyBytes = 256 << 10
	// MaxPageSize bounds List's page size; the least is 1.
	MaxPageSize = 1000
	// MaxPageBytes bounds the encoded records of one page.
	MaxPageBytes = 4 << 20
	// MinLeaseTTL and MaxLeaseTTL bound an owner lease's TTL (Consul's
	// defaults are 10 s .. 24 h; consulstore's test server lowers the minimum).
	MinLeaseTTL = time.Second
	MaxLeaseTTL = 24 * time.Hour
)

// Store is the Location Store. Every read that decides ownership is
// consistent (linearizable); every mutation is a compare-and-set on versions
// first read.
type Store interface {
	// Read returns the record of key, or ErrNotFound.
	Read(ctx context.Context, key AuthorityKey) (Versioned, error)
	// List returns one page of the records of a kind.
	List(ctx context.Context, kind Kind, page PageRequest) (Page, error)
	// CompareAndSet writes rec if key is at version expected (0: only if
	// absent) and returns the new version. A lost race is a *ConflictError.
	CompareAndSet(ctx context.Context, key AuthorityKey, expected StoreVersion, rec *Record) (StoreVersion, error)
	// Apply runs ops as one atomic transaction: all apply or none. It
	// returns, per op, the key's version after the transaction (0 for a
	// delete, and for a slot op: slots have no version). A failed
	// precondition is a *ConflictError naming the ops; a failed lease
	// check (OpCheckLease, OpTakeSlot, OpSetSlot) is ErrLeaseEnded.
	Apply(ctx context.Context, ops []Op) ([]StoreVersion, error)
	// Watch blocks until key is no longer at version after (absent counts as
	// version 0) and returns its new state, or until ctx ends.
	Watch(ctx context.Context, key AuthorityKey, after StoreVersion) (Versioned, error)

	// ClaimNode creates a lease of ttl and, in one transaction under it, the
	// node descriptor and its Entry Spot claim. If either exists nothing is
	// created and a *ConflictError returned (PROTOCOL.md §3.4). The descriptor
	// stored carries the lease ID.
	ClaimNode(ctx context.Context, node *NodeDescriptor, ttl time.Duration) (Lease, error)
	// RenewLease extends a lease and changes the version of the node
	// descriptor it holds: the heartbeat other nodes watch (a descriptor
	// whose version has not changed for a lease TTL belongs to a holder
	// that has fenced itself, docs/FAULTS.md). A renewal succeeds only
	// once both are done; ErrNotFound once the lease has ended.
	RenewLease(ctx context.Context, id LeaseID) error
	// RevokeLease ends the lease that holds node's descriptor, only while
	// that descriptor is still at version at: its holder has not renewed
	// since the revoker saw it at. Then the descriptor and everything else
	// the lease holds go, as when it expires, and ReadNode of node answers
	// ErrLeaseRevoked from then on. A descriptor at another version is a
	// *ConflictError and nothing changes; none, ErrNotFound.
	// Another node revokes the lease of a holder it has watched fall
	// silent for a lease TTL, so that the holder, fenced by then, can
	// never unfence and serve again (its next renewal finds the lease
	// gone).
	RevokeLease(ctx context.Context, node NodeKey, at StoreVersion) error
	// ReleaseNode deletes the descriptor and Entry claim of node only when
	// the stored descriptor has node's lease and lifecycle (node
	// generation); otherwise a *ConflictError and nothing is deleted, so a
	// stale cleanup cannot remove a replacement lifecycle (PROTOCOL.md §3.4).
	// It then ends the lease.
	ReleaseNode(ctx context.Context, node *NodeDescriptor) error
	// UpdateNode replaces the stored descriptor of node's lifecycle with
	// node, when it is at version expected and still held by node's live
	// lease, and returns the new version: a node publishes a change of its
	// status (DRAINING) or capacity this way. The fields fixed for a
	// lifecycle (mesh, RID, node generation, Entry Spot ID, lease ID, name,
	// address) must equal the stored ones (ErrInvalid otherwise; node's
	// lease ID must be set). A lost race, or another live lease holding
	// the descriptor, is a *ConflictError; no descriptor, ErrNotFound;
	// node's lease has ended, ErrLeaseEnded. The descriptor stays held by
	// the lease: it is still deleted when the lease ends.
	UpdateNode(ctx context.Context, node *NodeDescriptor, expected StoreVersion) (StoreVersion, error)
	// ReadNode returns a node descriptor, or ErrNotFound.
	ReadNode(ctx context.Context, key NodeKey) (VersionedNode, error)
	// ListNodes returns every node descriptor of a mesh ("" = all meshes).
	ListNodes(ctx context.Context, mesh string) ([]VersionedNode, error)
	// LeaseAlive reports whether an owner lease is still in force.
	LeaseAlive(ctx context.Context, id LeaseID) (bool, error)
	// ListSlots returns the held capacity slots of node, sorted by index
	// (none once its lease has ended), read consistently: a node counts
	// its active and pending capacity and finds free indexes with it.
	ListSlots(ctx context.Context, node NodeKey) ([]Slot, error)

	// Close releases the store's resources; leases are left to expire.
	Close() error
}

// PageRequest asks for up to Size records after the opaque cursor After
// ("" = from the start).
type PageRequest struct {
	Size  int
	After string
}

// Page is one page of List. Next is the cursor of the following page, ""
// when this is the last one.
type Page struct {
	Items []Versioned
	Next  string
}

// Validate reports ErrInvalid for a size outside 1..MaxPageSize.
func (p PageRequest) Validate() error {
	if p.Size < 1 || p.Size > MaxPageSize {
		return fmt.Errorf("%w: page size %d outside 1..%d", ErrInvalid, p.Size, MaxPageSize)
	}
	return nil
}

// OpKind is what one Apply operation does.
type OpKind int

// The Apply operations.
const (
	// OpCreate writes Record only if Key is absent.
	OpCreate OpKind = iota + 1
	// OpUpdate writes Record only if Key is at Version.
	OpUpdate
	// OpDelete deletes Key only if it is at Version.
	OpDelete
	// OpCheck changes nothing and fails unless Key is at Version (0: absent).
	OpCheck
	// OpCheckLease changes nothing and fails the whole transaction with
	// ErrLeaseEnded unless the node descriptor Node is held by the live
	// lease Lease. A node adds it to every write it makes, so a node whose
	// lease has ended can never change a record, however late its write
	// reaches the store (docs/FAULTS.md, lease fencing).
	OpCheckLease
	// OpTakeSlot creates capacity slot Slot of node Node, held by the
	// object Key (pending or active as Pending says) under the lease
	// Lease, only if the slot is absent: a held slot fails the
	// transaction as a *ConflictError naming this op (as a failed
	// OpCreate does), and a Lease that is not live or does not hold Node's
	// descriptor fails it with ErrLeaseEnded (as OpCheckLease does). The
	// slot is held by the lease: it goes when the lease ends. Writing it
	// in the same transaction as the holder's record is what makes a
	// node's count of its slots agree with the records it owns.
	OpTakeSlot
	// OpSetSlot writes slot Slot of Node (holder Key, Pending) under
	// Lease whether or not it exists — a reserved (pending) slot turned
	// active at a commit, or a slot handed to another holder; ErrLeaseEnded
	// as for OpTakeSlot.
	OpSetSlot
	// OpFreeSlot deletes slot Slot of Node if it is there; an absent slot
	// (already freed, or gone with its lease) is no failure. It checks
	// nothing: the caller's compare-and-set of its record in the same
	// transaction is what makes the free its own.
	OpFreeSlot
	// OpCreateRoot stores Data as the Relocation Store root RootKey
	// (RootStore, with the reference NewRootRef(RootKey, Data)) only if no
	// root is stored under RootKey: one there, whatever its bytes, fails
	// the transaction as a *ConflictError naming this op. Data is at most
	// MaxInlineRootBytes; a larger root is stored by PutRoot before the
	// transaction that points at it. It touches no record. Writing a small
	// root in the same transaction as the record that points at it (a cold
	// activation's reservation) saves the round trip of a PutRoot, and a
	// transaction that fails leaves no root behind.
	OpCreateRoot
	// OpCheckNoCheckpoint changes nothing and fails the transaction as a
	// *ConflictError naming this op if Key has a checkpoint in this store
	// (the store's own CheckpointStore, whatever the checkpoint's bytes).
	// It touches no record: Key may also be another op's. A cold
	// activation's reservation carries it, so that a reservation that
	// lands proves no checkpoint of the ID exists, and the new incarnation
	// needs no read of one before it starts (docs/FAULTS.md, "Checkpoints
	// and recovery").
	OpCheckNoCheckpoint
	// OpDeleteRoot deletes the Relocation Store root RootKey if one is
	// stored (an absent root is no failure), as RootStore.DeleteRoot does.
	// It checks nothing: the transaction's compare-and-set of the record
	// that named the root (a recovery pointer's removal) is what makes the
	// delete its own, and a transaction that fails deletes nothing. It
	// touches no record.
	OpDeleteRoot
)

// MaxInlineRootBytes bounds the root an OpCreateRoot stores.
const MaxInlineRootBytes = 64 << 10

func (k OpKind) String() string {
	switch k {
	case OpCreate:
		return "create"
	case OpUpdate:
		return "update"
	case OpDelete:
		return "delete"
	case OpCheck:
		return "check"
	case OpCheckLease:
		return "check-lease"
	case OpTakeSlot:
		return "take-slot"
	case OpSetSlot:
		return "set-slot"
	case OpFreeSlot:
		return "free-slot"
	case OpCreateRoot:
		return "create-root"
	case OpCheckNoCheckpoint:
		return "check-no-checkpoint"
	case OpDeleteRoot:
		return "delete-root"
	}
	return fmt.Sprintf("op%d", int(k))
}

// Op is one operation of an Apply transaction. Node and Lease are set only
// for OpCheckLease, which has no Key, and for the slot ops (OpTakeSlot,
// OpSetSlot: Node, Lease, Slot, Pending and the holder Key; OpFreeSlot:
// Node and Slot only). Slot ops touch no record: Key is the slot's
// holder, and may be a key another op of the transaction writes.
type Op struct {
	Kind    OpKind
	Key     AuthorityKey
	Version StoreVersion
	Record  *Record
	Node    NodeKey
	Lease   LeaseID
	// Slot is the index of a capacity slot of Node (slot ops).
	Slot uint32
	// Pending marks a slot reserved for an object on its way in, not yet
	// committed to the node (OpTakeSlot, OpSetSlot).
	Pending bool
	// RootKey and Data are the root an OpCreateRoot stores.
	RootKey string
	Data    []byte
}

// Slot is one capacity slot of a node lifecycle: a node of capacity C
// owns slot indexes 0..C-1, each free (absent) or held by one object,
// pending (reserved for an object moving in) or active. Slots live under
// the node's owner lease and vanish when it ends, so a new lifecycle of
// the node starts with none.
type Slot struct {
	Index   uint32
	Holder  AuthorityKey
	Pending bool
}

// SortSlots orders slots by index, the order ListSlots returns in every
// store.
func SortSlots(slots []Slot) {
	sort.Slice(slots, func(i, j int) bool { return slots[i].Index < slots[j].Index })
}

// CreateOp creates key with rec if absent.
func CreateOp(key AuthorityKey, rec *Record) Op { return Op{Kind: OpCreate, Key: key, Record: rec} }

// UpdateOp writes rec if key is at version.
func UpdateOp(key AuthorityKey, version StoreVersion, rec *Record) Op {
	return Op{Kind: OpUpdate, Key: key, Version: version, Record: rec}
}

// DeleteOp deletes key if it is at version.
func DeleteOp(key AuthorityKey, version StoreVersion) Op {
	return Op{Kind: OpDelete, Key: key, Version: version}
}

// CheckOp requires key to be at version (0: absent).
func CheckOp(key AuthorityKey, version StoreVersion) Op {
	return Op{Kind: OpCheck, Key: key, Version: version}
}

// CompareAndSetByApply implements Store.CompareAndSet with one Apply of an
// update (or, at version 0, a create), as every Store does: a lost race is
// the *ConflictError Apply returns, named after compare-and-set.
func CompareAndSetByApply(ctx context.Context, apply func(context.Context, []Op) ([]StoreVersion, error), key AuthorityKey, expected StoreVersion, rec *Record) (StoreVersion, error) {
	op := UpdateOp(key, expected, rec)
	if expected == 0 {
		op = CreateOp(key, rec)
	}
	versions, err := apply(ctx, []Op{op})
	if err != nil {
		var c *ConflictError
		if errors.As(err, &c) {
			c.Op = "compare-and-set"
		}
		return 0, err
	}
	return versions[0], nil
}

// CheckLeaseOp requires the descriptor of node to be held by the live lease
// (its owner lease); it fails the transaction with ErrLeaseEnded otherwise.
func CheckLeaseOp(node NodeKey, lease LeaseID) Op {
	return Op{Kind: OpCheckLease, Node: node, Lease: lease}
}

// TakeSlotOp takes slot of node for holder under lease, only if the slot
// is free.
func TakeSlotOp(node NodeKey, lease LeaseID, slot uint32, holder AuthorityKey, pending bool) Op {
	return Op{Kind: OpTakeSlot, Node: node, Lease: lease, Slot: slot, Key: holder, Pending: pending}
}

// SetSlotOp writes slot of node (holder, pending) under lease, free or not.
func SetSlotOp(node NodeKey, lease LeaseID, slot uint32, holder AuthorityKey, pending bool) Op {
	return Op{Kind: OpSetSlot, Node: node, Lease: lease, Slot: slot, Key: holder, Pending: pending}
}

// FreeSlotOp frees slot of node if it is held.
func FreeSlotOp(node NodeKey, slot uint32) Op {
	return Op{Kind: OpFreeSlot, Node: node, Slot: slot}
}

// IsSlotOp reports whether k is one of the slot ops, which touch no record.
func (k OpKind) IsSlotOp() bool { return k == OpTakeSlot || k == OpSetSlot || k == OpFreeSlot }

// OnRecord reports whether an op of kind k names a record by its Key
// (create, update, delete, check): the ops a *ConflictError's Current
// reports.
func (k OpKind) OnRecord() bool {
	return k == OpCreate || k == OpUpdate || k == OpDelete || k == OpCheck
}

// DeleteRootOp deletes the root key, if it is there.
func DeleteRootOp(key string) Op { return Op{Kind: OpDeleteRoot, RootKey: key} }

// CheckNoCheckpointOp fails its transaction if key has a checkpoint.
func CheckNoCheckpointOp(key AuthorityKey) Op { return Op{Kind: OpCheckNoCheckpoint, Key: key} }

// CreateRootOp stores data as the root key only if no root is there.
func CreateRootOp(key string, data []byte) Op {
	return Op{Kind: OpCreateRoot, RootKey: key, Data: data}
}

// ApplyOpCount is what ops count against MaxApplyOps: the operations of
// the Consul transaction they make, the store with the tightest limit
// (128 operations). One each, plus one for each OpTakeSlot (a check that
// the slot is free and its write) and for each OpCreateRoot of some bytes
// (its part beside its manifest), plus one lease check for each
// distinct (node, lease) of the OpTakeSlot and OpSetSlot ops that the
// transaction's OpCheckLease does not already make. A node's slot ops
// name its own lease, which its writes check anyway, so they usually
// add nothing but the OpTakeSlot checks.
func ApplyOpCount(ops []Op) int {
	n := len(ops)
	// The distinct (node, lease) checked: a few at most, so a slice
	// searched in line (this runs for every transaction).
	var buf [4]nodeLease
	checked := buf[:0]
	seen := func(nl nodeLease) bool {
		for _, c := range checked {
			if c == nl {
				return true
			}
		}
		return false
	}
	for _, op := range ops {
		if op.Kind == OpCheckLease {
			if nl := (nodeLease{op.Node, op.Lease}); !seen(nl) {
				checked = append(checked, nl)
			}
		}
	}
	for _, op := range ops {
		if op.Kind == OpTakeSlot || (op.Kind == OpCreateRoot && len(op.Data) > 0) || op.Kind == OpDeleteRoot {
			n++ // a slot check, a root's part beside its manifest, or a root's parts' delete beside its manifest's
		}
		if op.Kind == OpTakeSlot || op.Kind == OpSetSlot {
			if nl := (nodeLease{op.Node, op.Lease}); !seen(nl) {
				checked = append(checked, nl)
				n++
			}
		}
	}
	return n
}

type nodeLease struct {
	node  NodeKey
	lease LeaseID
}

// EncodedSize is the size of a record as the contract counts it against
// MaxRecordBytes, MaxApplyBytes and MaxPageBytes: its protojson form.
func EncodedSize(rec *Record) int {
	b, err := jsonOptions.Marshal(rec)
	if err != nil {
		return MaxRecordBytes + 1
	}
	return len(b)
}

var jsonOptions = protojson.MarshalOptions{UseProtoNames: true}

// sizeBound is a cheap upper bound of EncodedSize, from the binary size:
// protojson spends at most jsonExpansion bytes per binary byte (a field's
// name, quotes and an enum's name for a two-byte tag and value; six per
// byte of an escaped control character) plus jsonSlack. Records far under
// the limits (all of roam's own) skip the JSON encoding it costs to count
// them exactly, which was most of a small write's CPU.
func sizeBound(rec *Record) int { return proto.Size(rec)*jsonExpansion + jsonSlack }

const (
	jsonExpansion = 64
	jsonSlack     = 1024
)

// PageBytes is what memstore counts a listed record with against
// MaxPageBytes: an upper bound of EncodedSize that walks the record's set
// fields instead of encoding it (a tenth of the cost; a start-up scan
// lists every record). It is exact but for string escapes and protojson's
// optional spaces, which it counts as if present. Records have no
// well-known types, whose JSON forms it does not know.
// A record protojson cannot encode (a string that is not UTF-8) counts as
// EncodedSize counts it: over MaxRecordBytes.
func PageBytes(rec *Record) int {
	n, ok := jsonBound(rec.ProtoReflect())
	if !ok {
		return MaxRecordBytes + 1
	}
	return n
}

func jsonBound(m protoreflect.Message) (n int, ok bool) {
	n, ok = 2, true // {}
	add := func(k int, valid bool) {
		n += k
		ok = ok && valid
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		n += len(fd.Name()) + 5 // "name": and a comma, each with a space
		switch {
		case fd.IsList():
			l := v.List()
			n += 2 + 2*l.Len()
			for i := 0; i < l.Len(); i++ {
				add(jsonValueBound(fd, l.Get(i)))
			}
		case fd.IsMap():
			n += 2
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				add(jsonStringBound(k.String()))
				n += 3
				add(jsonValueBound(fd.MapValue(), mv))
				return true
			})
		default:
			add(jsonValueBound(fd, v))
		}
		return ok
	})
	return n, ok
}

func jsonValueBound(fd protoreflect.FieldDescriptor, v protoreflect.Value) (int, bool) {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return jsonBound(v.Message())
	case protoreflect.StringKind:
		return jsonStringBound(v.String())
	case protoreflect.BytesKind:
		return 2 + 4*((len(v.Bytes())+2)/3), true
	case protoreflect.BoolKind:
		return 5, true
	case protoreflect.EnumKind:
		if ev := fd.Enum().Values().ByNumber(v.Enum()); ev != nil {
			return len(ev.Name()) + 2, true
		}
		return 11, true
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind,
		protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return 22, true // quoted
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		return 32, true
	}
	return 11, true // 32-bit integers
}

// jsonStringBound bounds a quoted JSON string: a control character takes
// six bytes escaped, a quote or backslash two, and U+2028/U+2029 (three
// bytes, the first 0xE2) six. A string that is not UTF-8 has no JSON form
// (false).
func jsonStringBound(s string) (int, bool) {
	n := 2 + len(s)
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20:
			n += 5
		case c == '"', c == '\\', c == 0xE2:
			n++
		}
	}
	return n, utf8.ValidString(s)
}

// ValidateRecord checks a record before it is written.
func ValidateRecord(rec *Record) error {
	_, err := validatedSize(rec)
	return err
}

// validatedSize checks rec and returns a size to count it with against
// MaxApplyBytes: its bound when the bound is under MaxRecordBytes, else its
// exact EncodedSize.
func validatedSize(rec *Record) (int, error) {
	if rec == nil {
		return 0, fmt.Errorf("%w: nil record", ErrInvalid)
	}
	if n := sizeBound(rec); n <= MaxRecordBytes {
		return n, nil
	}
	n := EncodedSize(rec)
	if n > MaxRecordBytes {
		return 0, fmt.Errorf("%w: record is %d bytes encoded, over %d", ErrTooLarge, n, MaxRecordBytes)
	}
	return n, nil
}

// ValidateOps checks an Apply request against the contract before anything
// is sent: op count (ApplyOpCount), kinds, keys, records, total size, one
// op per key and one per slot.
func ValidateOps(ops []Op) error {
	if len(ops) == 0 {
		return fmt.Errorf("%w: empty transaction", ErrInvalid)
	}
	if len(ops) > MaxApplyOps {
		return fmt.Errorf("%w: %d operations, over %d", ErrTooLarge, len(ops), MaxApplyOps)
	}
	total := 0
	seen := make(map[AuthorityKey]bool, len(ops))
	var slots map[slotOf]bool
	var roots map[string]bool
	var noCheckpoint map[AuthorityKey]bool
	leaseChecks := 0
	for i, op := range ops {
		if op.Kind == OpCheckLease {
			if err := op.Node.Validate(); err != nil {
				return fmt.Errorf("op %d: %w", i, err)
			}
			if op.Lease == "" {
				return fmt.Errorf("%w: op %d: lease check without a lease", ErrInvalid, i)
			}
			if leaseChecks++; leaseChecks > 1 {
				return fmt.Errorf("%w: op %d: more than one lease check", ErrInvalid, i)
			}
			continue
		}
		if op.Kind == OpDeleteRoot {
			if err := ValidateID("root key", op.RootKey); err != nil {
				return fmt.Errorf("op %d: %w", i, err)
			}
			if roots[op.RootKey] {
				return fmt.Errorf("%w: op %d: root %q appears twice", ErrInvalid, i, op.RootKey)
			}
			if roots == nil {
				roots = map[string]bool{}
			}
			roots[op.RootKey] = true
			total += len(op.RootKey)
			continue
		}
		if op.Kind == OpCreateRoot {
			if err := ValidateRoot(op.RootKey, op.Data); err != nil {
				return fmt.Errorf("op %d: %w", i, err)
			}
			if len(op.Data) > MaxInlineRootBytes {
				return fmt.Errorf("%w: op %d: root %q is %d bytes, over %d in a transaction (PutRoot stores it)", ErrTooLarge, i, op.RootKey, len(op.Data), MaxInlineRootBytes)
			}
			if roots[op.RootKey] {
				return fmt.Errorf("%w: op %d: root %q appears twice", ErrInvalid, i, op.RootKey)
			}
			if roots == nil {
				roots = map[string]bool{}
			}
			roots[op.RootKey] = true
			total += len(op.RootKey) + len(op.Data)
			continue
		}
		if op.Kind == OpCheckNoCheckpoint {
			if err := op.Key.Validate(); err != nil {
				return fmt.Errorf("op %d: %w", i, err)
			}
			if noCheckpoint[op.Key] {
				return fmt.Errorf("%w: op %d: checkpoint of %s checked twice", ErrInvalid, i, op.Key)
			}
			if noCheckpoint == nil {
				noCheckpoint = map[AuthorityKey]bool{}
			}
			noCheckpoint[op.Key] = true
			total += len(op.Key.ID)
			continue
		}
		if op.Kind.IsSlotOp() {
			if err := validateSlotOp(op); err != nil {
				return fmt.Errorf("op %d: %w", i, err)
			}
			// Two ops on one slot would each see the slot as it was
			// before the transaction (Consul checks every op against the
			// state before it), so their outcome would differ by store.
			so := slotOf{op.Node, op.Slot}
			if slots[so] {
				return fmt.Errorf("%w: op %d: slot %d of %s appears twice", ErrInvalid, i, op.Slot, op.Node)
			}
			if slots == nil {
				slots = map[slotOf]bool{}
			}
			slots[so] = true
			total += slotOpSize(op)
			continue
		}
		if err := op.Key.Validate(); err != nil {
			return fmt.Errorf("op %d: %w", i, err)
		}
		if seen[op.Key] {
			return fmt.Errorf("%w: op %d: key %s appears twice", ErrInvalid, i, op.Key)
		}
		seen[op.Key] = true
		total += len(op.Key.ID)
		switch op.Kind {
		case OpCreate, OpUpdate:
			if op.Kind == OpUpdate && op.Version == 0 {
				return fmt.Errorf("%w: op %d: update needs a version (use create)", ErrInvalid, i)
			}
			n, err := validatedSize(op.Record)
			if err != nil {
				return fmt.Errorf("op %d: %w", i, err)
			}
			total += n
		case OpDelete:
			if op.Version == 0 {
				return fmt.Errorf("%w: op %d: delete needs a version", ErrInvalid, i)
			}
		case OpCheck:
		default:
			return fmt.Errorf("%w: op %d: unknown kind %d", ErrInvalid, i, op.Kind)
		}
	}
	if n := ApplyOpCount(ops); n > MaxApplyOps {
		return fmt.Errorf("%w: %d operations (counting slot checks), over %d", ErrTooLarge, n, MaxApplyOps)
	}
	if total > MaxApplyBytes {
		// The bounds add up past the limit: count exactly.
		total = 0
		for _, op := range ops {
			switch {
			case op.Kind == OpCheckLease:
			case op.Kind == OpCheckNoCheckpoint:
				total += len(op.Key.ID)
			case op.Kind == OpDeleteRoot:
				total += len(op.RootKey)
			case op.Kind == OpCreateRoot:
				total += len(op.RootKey) + len(op.Data)
			case op.Kind.IsSlotOp():
				total += slotOpSize(op)
			default:
				total += len(op.Key.ID)
				if op.Kind == OpCreate || op.Kind == OpUpdate {
					total += EncodedSize(op.Record)
				}
			}
		}
	}
	if total > MaxApplyBytes {
		return fmt.Errorf("%w: transaction is %d bytes, over %d", ErrTooLarge, total, MaxApplyBytes)
	}
	return nil
}

// slotOf names one slot of one node.
type slotOf struct {
	node NodeKey
	slot uint32
}

// validateSlotOp checks a slot op's node, lease and holder.
func validateSlotOp(op Op) error {
	if err := op.Node.Validate(); err != nil {
		return err
	}
	if op.Kind == OpFreeSlot {
		return nil
	}
	if op.Lease == "" {
		return fmt.Errorf("%w: %s without a lease", ErrInvalid, op.Kind)
	}
	if err := op.Key.Validate(); err != nil {
		return fmt.Errorf("%s holder: %w", op.Kind, err)
	}
	return nil
}

// slotOpSize is what a slot op counts against MaxApplyBytes: its IDs.
func slotOpSize(op Op) int {
	n := len(op.Node.Mesh) + len(op.Node.NodeRid)
	if op.Kind != OpFreeSlot {
		n += len(op.Key.ID)
	}
	return n
}

// ValidateNode checks a descriptor before a claim.
func ValidateNode(node *NodeDescriptor) error {
	if node == nil {
		return fmt.Errorf("%w: nil node descriptor", ErrInvalid)
	}
	if err := (NodeKey{Mesh: node.GetMesh(), NodeRid: node.GetNodeRid()}).Validate(); err != nil {
		return err
	}
	if node.GetNodeGeneration() == 0 {
		return fmt.Errorf("%w: node generation is 0", ErrInvalid)
	}
	if node.GetName() != "" {
		if err := ValidateID("node name", node.GetName()); err != nil {
			return err
		}
	}
	return ValidateID("entry spot id", node.GetEntrySpotId())
}

// ValidateTTL checks an owner lease TTL.
func ValidateTTL(ttl time.Duration) error {
	if ttl < MinLeaseTTL || ttl > MaxLeaseTTL || ttl%time.Second != 0 {
		return fmt.Errorf("%w: lease ttl %s must be whole seconds in %s..%s", ErrInvalid, ttl, MinLeaseTTL, MaxLeaseTTL)
	}
	return nil
}

// OwnerOf is node's lifecycle as the owner a record names: its lease, and
// that lease's TTL (so a node that never saw the descriptor waits the
// owner's TTL, not its own, before it takes it for ended).
func OwnerOf(node *NodeDescriptor) *messages.Owner {
	return &messages.Owner{
		Mesh:            node.GetMesh(),
		NodeRid:         node.GetNodeRid(),
		NodeGeneration:  node.GetNodeGeneration(),
		LeaseId:         node.GetLeaseId(),
		LeaseTtlSeconds: node.GetLeaseTtlSeconds(),
	}
}

// NodeKeyOf returns the key of a descriptor.
func NodeKeyOf(node *NodeDescriptor) NodeKey {
	return NodeKey{Mesh: node.GetMesh(), NodeRid: node.GetNodeRid()}
}

// EntryClaim is the record a node claim writes for its Entry Spot: Ready,
// owned by the node under its lease (PROTOCOL.md §3.4).
func EntryClaim(node *NodeDescriptor, lease LeaseID) *Record {
	return &Record{
		ObjectGeneration:         1,
		AuthorityOwnerGeneration: 1,
		State:                    messages.LifecycleState_LIFECYCLE_STATE_READY,
		SpotKind:                 messages.SpotKind_SPOT_KIND_ENTRY,
		Owner:                    ownerUnder(node, lease),
	}
}

func ownerUnder(node *NodeDescriptor, lease LeaseID) *messages.Owner {
	o := OwnerOf(node)
	o.LeaseId = string(lease)
	return o
}

// ValidateNodeUpdateRequest checks a descriptor given to Store.UpdateNode
// before the stored one is read: a valid descriptor that names its lease,
// since the lease is what tells its lifecycle from another.
func ValidateNodeUpdateRequest(node *NodeDescriptor) error {
	if err := ValidateNode(node); err != nil {
		return err
	}
	if node.GetLeaseId() == "" {
		return fmt.Errorf("%w: an update of node %s without its lease id", ErrInvalid, NodeKeyOf(node))
	}
	return nil
}

// ValidateNodeUpdate checks that next changes none of the fields fixed for
// cur's lifecycle (Store.UpdateNode).
func ValidateNodeUpdate(cur, next *NodeDescriptor) error {
	if err := ValidateNode(next); err != nil {
		return err
	}
	if cur.GetMesh() != next.GetMesh() || cur.GetNodeRid() != next.GetNodeRid() ||
		cur.GetNodeGeneration() != next.GetNodeGeneration() || cur.GetEntrySpotId() != next.GetEntrySpotId() ||
		cur.GetLeaseId() != next.GetLeaseId() || cur.GetName() != next.GetName() || cur.GetAddress() != next.GetAddress() {
		return fmt.Errorf("%w: an update of node %s changes a field fixed for its lifecycle", ErrInvalid, NodeKeyOf(next))
	}
	return nil
}

// KeysReader is implemented by a store that reads several keys in one
// consistent round trip (consulstore: one read transaction; memstore: one
// lock). ReadKeys answers, for each key in order, what Read would: a
// missing key is a Versioned with that Key, Version 0 and no Record
// (Present false), not an error; an error is the whole call's. At most
// MaxApplyOps keys.
//
// A wrapper of such a store that changes what Read answers must answer
// ReadKeys the same way (ReadKeysByRead), or callers that read several keys
// at once bypass it.
type KeysReader interface {
	ReadKeys(ctx context.Context, keys ...AuthorityKey) ([]Versioned, error)
}

// ReadKeysByRead answers a ReadKeys call with one read call per key, in
// order: for a store wrapper whose Read is its own.
func ReadKeysByRead(ctx context.Context, read func(context.Context, AuthorityKey) (Versioned, error), keys ...AuthorityKey) ([]Versioned, error) {
	if err := ValidateReadKeys(keys); err != nil {
		return nil, err
	}
	out := make([]Versioned, len(keys))
	for i, k := range keys {
		v, err := read(ctx, k)
		switch {
		case errors.Is(err, ErrNotFound):
			v = Versioned{Key: k}
		case err != nil:
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// ValidateReadKeys checks a ReadKeys request: 1 to MaxApplyOps valid keys.
func ValidateReadKeys(keys []AuthorityKey) error {
	if len(keys) == 0 || len(keys) > MaxApplyOps {
		return fmt.Errorf("%w: read of %d keys (1 to %d)", ErrInvalid, len(keys), MaxApplyOps)
	}
	for i, k := range keys {
		if err := k.Validate(); err != nil {
			return fmt.Errorf("key %d: %w", i, err)
		}
	}
	return nil
}

// CheckpointsInApply is implemented by a Location Store that keeps its own
// checkpoints (CheckpointStore) and takes OpCheckNoCheckpoint in Apply
// (storetest.RunCheckpointsInApply): memstore and consulstore. Without it
// (or when it answers false) roam never sends that op.
type CheckpointsInApply interface {
	CheckpointsInApply() bool
}

// InProcess is implemented by a store whose calls stay in the process
// (memstore): a watch costs nothing there, so callers need not save one.
type InProcess interface {
	InProcess() bool
}

// Immediate is implemented by a store whose calls (but Watch) return at
// once: they wait on no I/O and on no other caller beyond a short lock
// (memstore). A caller may then make them on a goroutine that must not
// wait, instead of handing each to a goroutine of its own and taking the
// answer back — two scheduler wake-ups per call, which on a machine that
// was idle cost more than the call. Immediate returns the store itself: a
// wrapper that embeds such a store (and whose own methods may well wait)
// returns the embedded one, so a caller compares the answer with the
// store it holds (IsImmediate).
type Immediate interface {
	Immediate() Store
}

// IsImmediate reports whether s's own calls return at once (Immediate).
func IsImmediate(s Store) bool {
	im, ok := s.(Immediate)
	return ok && im.Immediate() == s
}
