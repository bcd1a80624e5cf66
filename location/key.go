package location

import (
	"fmt"
	"unicode/utf8"

	"github.com/roamactors/roam/messages"
)

// Kind is the namespace of an authority key.
type Kind = messages.AuthorityKind

// The authority kinds (docs/PROTOCOL.md §3.1).
const (
	KindEntry        Kind = messages.AuthorityKind_AUTHORITY_KIND_ENTRY
	KindUserSpot     Kind = messages.AuthorityKind_AUTHORITY_KIND_USER_SPOT
	KindInstanceSpot Kind = messages.AuthorityKind_AUTHORITY_KIND_INSTANCE_SPOT
	KindActor        Kind = messages.AuthorityKind_AUTHORITY_KIND_ACTOR
)

// Kinds lists every valid Kind.
var Kinds = []Kind{KindEntry, KindUserSpot, KindInstanceSpot, KindActor}

// MaxIDBytes is the longest Spot ID, Actor ID, mesh or node RID (PROTOCOL.md §7.1).
const MaxIDBytes = 255

// AuthorityKey names one record: a kind and an ID compared byte for byte.
type AuthorityKey struct {
	Kind Kind
	ID   string
}

// Key is shorthand for AuthorityKey{kind, id}.
func Key(kind Kind, id string) AuthorityKey { return AuthorityKey{Kind: kind, ID: id} }

func (k AuthorityKey) String() string { return fmt.Sprintf("%s/%q", KindName(k.Kind), k.ID) }

// Validate reports ErrInvalid for an unknown kind or an ID that is not
// 1..255 bytes of valid UTF-8 (PROTOCOL.md §7.1).
func (k AuthorityKey) Validate() error {
	if !validKind(k.Kind) {
		return fmt.Errorf("%w: unknown authority kind %d", ErrInvalid, k.Kind)
	}
	return ValidateID("id", k.ID)
}

// ValidateID checks a Spot ID, Actor ID, mesh name or node RID: UTF-8,
// 1..255 bytes (PROTOCOL.md §7.1). what names the field in the error.
func ValidateID(what, id string) error {
	switch {
	case len(id) == 0:
		return fmt.Errorf("%w: %s is empty", ErrInvalid, what)
	case len(id) > MaxIDBytes:
		return fmt.Errorf("%w: %s is %d bytes, over %d", ErrInvalid, what, len(id), MaxIDBytes)
	case !utf8.ValidString(id):
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalid, what)
	}
	return nil
}

func validKind(k Kind) bool {
	for _, v := range Kinds {
		if v == k {
			return true
		}
	}
	return false
}

// KindName is the short, stable name of a kind: entry, user_spot,
// instance_spot or actor.
func KindName(k Kind) string {
	switch k {
	case KindEntry:
		return "entry"
	case KindUserSpot:
		return "user_spot"
	case KindInstanceSpot:
		return "instance_spot"
	case KindActor:
		return "actor"
	}
	return fmt.Sprintf("kind%d", int32(k))
}

// NodeKey names a node descriptor: (mesh, node RID).
type NodeKey struct {
	Mesh    string
	NodeRid string
}

// Validate reports ErrInvalid unless both parts are valid IDs.
func (k NodeKey) Validate() error {
	if err := ValidateID("mesh", k.Mesh); err != nil {
		return err
	}
	return ValidateID("node rid", k.NodeRid)
}

func (k NodeKey) String() string { return fmt.Sprintf("node %q/%q", k.Mesh, k.NodeRid) }
