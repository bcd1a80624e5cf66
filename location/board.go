package location

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
)

// Board keeps small documents (notes) that operators and nodes exchange
// through the store: an operator's requests to a node lifecycle (drain,
// move), the node's progress on them and the moves it made
// (docs/OPERATIONS.md). A note never decides ownership; the authority
// records do. Notes are grouped by mesh and node RID; consulstore keeps
// them under "<prefix>/note/<mesh>/<rid>/<name>", readable JSON,
// memstore in memory. Notes are not tied to any lease: a node removes its
// own when it stops, and any node may remove the notes of a lifecycle
// that is no longer in the store (SweepNotes).
type Board interface {
	// ReadNote returns a note, or ErrNotFound.
	ReadNote(ctx context.Context, key NoteKey) (Note, error)
	// WriteNote writes value if key is at version expected (0: only if
	// absent) and returns the new version; a lost race is a
	// *ConflictError. Every accepted write gets a new version, even of the
	// same bytes.
	WriteNote(ctx context.Context, key NoteKey, expected StoreVersion, value []byte) (StoreVersion, error)
	// DeleteNote deletes key if it is at version expected (0: whatever its
	// version); deleting a missing note is not an error.
	DeleteNote(ctx context.Context, key NoteKey, expected StoreVersion) error
	// WatchNote blocks until key is no longer at version after (absent
	// counts as version 0) and returns its new state (Version 0 when
	// absent), or until ctx ends.
	WatchNote(ctx context.Context, key NoteKey, after StoreVersion) (Note, error)
	// ListNotes returns the notes of a mesh ("" = all meshes), ordered by
	// mesh, node and name.
	ListNotes(ctx context.Context, mesh string) ([]Note, error)
}

// NoteKey names one note: the node lifecycle (mesh and node RID) it is
// about, and its name.
type NoteKey struct {
	Mesh    string
	NodeRid string
	Name    string
}

func (k NoteKey) String() string { return "note " + k.Mesh + "/" + k.NodeRid + "/" + k.Name }

// Note is a note as read. Version 0 means absent.
type Note struct {
	Key     NoteKey
	Value   []byte
	Version StoreVersion
}

// SortNotes orders notes by mesh, node RID and name, the order ListNotes
// returns in every store.
func SortNotes(notes []Note) {
	sort.Slice(notes, func(i, j int) bool {
		a, b := notes[i].Key, notes[j].Key
		if a.Mesh != b.Mesh {
			return a.Mesh < b.Mesh
		}
		if a.NodeRid != b.NodeRid {
			return a.NodeRid < b.NodeRid
		}
		return a.Name < b.Name
	})
}

// ClusterNotes is the node RID under which notes about a whole mesh are
// kept (the placement ledger, docs/PLACEMENT.md §4): no node has it (node
// RIDs are UUIDs) and SweepNotes keeps its notes.
const ClusterNotes = "cluster"

// MaxNoteBytes bounds one note's value.
const MaxNoteBytes = 64 << 10

var noteName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// Validate reports ErrInvalid for a bad key: mesh and RID as a NodeKey's,
// a name of 1..128 letters, digits, '.', '_' or '-' (not first).
func (k NoteKey) Validate() error {
	if err := (NodeKey{Mesh: k.Mesh, NodeRid: k.NodeRid}).Validate(); err != nil {
		return err
	}
	if !noteName.MatchString(k.Name) {
		return fmt.Errorf("%w: note name %q", ErrInvalid, k.Name)
	}
	return nil
}

// ValidateNote checks a note before it is written.
func ValidateNote(key NoteKey, value []byte) error {
	if err := key.Validate(); err != nil {
		return err
	}
	if len(value) > MaxNoteBytes {
		return fmt.Errorf("%w: note %s is %d bytes, over %d", ErrTooLarge, key, len(value), MaxNoteBytes)
	}
	return nil
}

// SweepNotes deletes the notes of node lifecycles of mesh that have no
// descriptor in store any more (ended or stopped), except the mesh's
// ClusterNotes, and returns how many
// it deleted. A note written for a lifecycle between the list of nodes
// and the delete may go too: notes are advisory.
func SweepNotes(ctx context.Context, store Store, board Board, mesh string) (int, error) {
	nodes, err := store.ListNodes(ctx, mesh)
	if err != nil {
		return 0, err
	}
	live := map[NodeKey]bool{}
	for _, n := range nodes {
		live[NodeKeyOf(n.Node)] = true
	}
	notes, err := board.ListNotes(ctx, mesh)
	if err != nil {
		return 0, err
	}
	deleted := 0
	for _, n := range notes {
		if n.Key.NodeRid == ClusterNotes || live[NodeKey{Mesh: n.Key.Mesh, NodeRid: n.Key.NodeRid}] {
			continue
		}
		if err := board.DeleteNote(ctx, n.Key, n.Version); err != nil {
			if errors.Is(err, ErrConflict) {
				continue
			}
			return deleted, err
		}
		deleted++
	}
	return deleted, nil
}
