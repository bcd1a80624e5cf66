package location

import (
	"context"
	"crypto/sha256"
	"fmt"
)

// RootStore is the Relocation Store (docs/PROTOCOL.md §3.5): it keeps immutable
// byte strings — the recovery root of a cold activation (the complete
// activation envelope, PROTOCOL.md §7.5) and the content of a creation
// request (PROTOCOL.md §7.2) — apart
// from the authority records, which only point at them by RootRef. A root
// is written once and never changed; it is deleted once nothing points at
// it. consulstore keeps roots under "<prefix>/root/", memstore in memory.
type RootStore interface {
	// PutRoot stores data under key once and returns its reference
	// (key, SHA-256, size). Storing identical bytes again returns the same
	// reference; other bytes under a key that exists are a *ConflictError.
	// The root is readable only once complete: a crash half-way leaves
	// nothing GetRoot returns.
	PutRoot(ctx context.Context, key string, data []byte) (RootRef, error)
	// GetRoot returns a root's bytes after checking them against their
	// SHA-256, or ErrNotFound.
	GetRoot(ctx context.Context, key string) ([]byte, RootRef, error)
	// DeleteRoot removes a root; deleting a missing root is not an error.
	DeleteRoot(ctx context.Context, key string) error
}

// RootRef is what a record keeps of a root: where it is, its hash and its
// size, so a reader can tell the content it finds is the content recorded
// (PROTOCOL.md §3.5).
type RootRef struct {
	Key    string
	SHA256 [sha256.Size]byte
	Size   uint64
}

// MaxRootBytes bounds one root: a creation request is at most 1 MiB
// (PROTOCOL.md §7.2); an activation envelope carries one first message of at
// most that plus its routing fields.
const MaxRootBytes = 1<<20 + 64<<10

// NewRootRef computes the reference of data stored under key.
func NewRootRef(key string, data []byte) RootRef {
	return RootRef{Key: key, SHA256: sha256.Sum256(data), Size: uint64(len(data))}
}

// ValidateRoot checks a root key (1..255 bytes of UTF-8) and size.
func ValidateRoot(key string, data []byte) error {
	if err := ValidateID("root key", key); err != nil {
		return err
	}
	if len(data) > MaxRootBytes {
		return fmt.Errorf("%w: root %q is %d bytes, over %d", ErrTooLarge, key, len(data), MaxRootBytes)
	}
	return nil
}
