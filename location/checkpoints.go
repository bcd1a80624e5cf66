package location

import (
	"context"
	"fmt"
)

// CheckpointStore keeps the last checkpoint of each relocatable object: the
// state its owner captured while it served, from which a live node brings
// the object back after its owner ended (docs/FAULTS.md, "Checkpoints and
// recovery"). It is a versioned blob store: roam encodes the bytes (with
// their fence and checksum), decides which checkpoint wins, and writes by
// compare-and-set; an implementation only stores bytes under a version.
//
// memstore and consulstore are CheckpointStores; an application may bring
// its own (roam.WithCheckpointStore), which must pass
// storetest.RunCheckpoints.
type CheckpointStore interface {
	// GetCheckpoint returns the bytes stored for key and their version, or
	// ErrNotFound. It never returns part of a write: a reader sees a
	// complete earlier or a complete later checkpoint.
	GetCheckpoint(ctx context.Context, key AuthorityKey) ([]byte, StoreVersion, error)
	// PutCheckpoint stores data for key only if the stored version is
	// expected (0: only if key has no checkpoint) and returns the new
	// version, non-zero and different from every version key had before
	// (also when data equals the stored bytes). A lost comparison is a
	// *ConflictError and changes nothing; data over MaxCheckpointBytes is
	// ErrTooLarge. The bytes are copied: the caller may reuse data.
	PutCheckpoint(ctx context.Context, key AuthorityKey, expected StoreVersion, data []byte) (StoreVersion, error)
	// DeleteCheckpoint removes key's checkpoint: with expected 0 whatever
	// is stored, else only at that version (another is a
	// *ConflictError). Deleting a missing checkpoint is not an error.
	DeleteCheckpoint(ctx context.Context, key AuthorityKey, expected StoreVersion) error
}

// MaxCheckpointBytes bounds one stored checkpoint: a state of up to
// 16 MiB (the default in-flight budget of one move) and roam's header.
const MaxCheckpointBytes = 16<<20 + 64<<10

// ValidateCheckpoint checks a checkpoint's key and size.
func ValidateCheckpoint(key AuthorityKey, data []byte) error {
	if err := key.Validate(); err != nil {
		return err
	}
	if len(data) > MaxCheckpointBytes {
		return fmt.Errorf("%w: checkpoint of %s is %d bytes, over %d", ErrTooLarge, key, len(data), MaxCheckpointBytes)
	}
	return nil
}
