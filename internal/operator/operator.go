// Package operator is how operators (roamctl) and nodes talk through the
// Location Store's board (location.Board; docs/OPERATIONS.md): an operator
// appends a request (drain, move) to the "requests" note of a node
// lifecycle; the node runs each request once and reports its progress in
// the note "status-<id>"; every node keeps the last moves it committed as
// target in its "moves" note. Notes are protojson, readable with
// `consul kv get`. None of it decides ownership: a requested move is the
// ordinary hand-off.
package operator

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// The note names of a node lifecycle.
const (
	RequestsNote = "requests"
	MovesNote    = "moves"
)

// StatusNote is the name of the status note of request id.
func StatusNote(id string) string { return "status-" + id }

// MaxPending bounds the requests waiting in one node's requests note.
const MaxPending = 64

var (
	marshal   = protojson.MarshalOptions{UseProtoNames: true}
	unmarshal = protojson.UnmarshalOptions{DiscardUnknown: true}
)

// Encode is a note's value for m.
func Encode(m proto.Message) ([]byte, error) { return marshal.Marshal(m) }

// Decode reads a note's value into m.
func Decode(b []byte, m proto.Message) error {
	if err := unmarshal.Unmarshal(b, m); err != nil {
		return fmt.Errorf("%w: note: %w", roamerr.ErrInvalidOperation, err)
	}
	return nil
}

// Submit appends req to the requests note of the node lifecycle (mesh,
// req.NodeRid). CapacityExceeded when MaxPending requests wait already.
func Submit(ctx context.Context, board location.Board, mesh string, req *messages.OperatorRequest) error {
	if req.GetId() == "" || req.GetNodeRid() == "" {
		return fmt.Errorf("%w: a request needs an id and a node", roamerr.ErrInvalidOperation)
	}
	return editRequests(ctx, board, location.NoteKey{Mesh: mesh, NodeRid: req.GetNodeRid(), Name: RequestsNote},
		func(list *messages.OperatorRequests) error {
			if len(list.Requests) >= MaxPending {
				return fmt.Errorf("%w: node %s has %d requests waiting", roamerr.ErrCapacityExceeded, req.GetNodeRid(), len(list.Requests))
			}
			list.Requests = append(list.Requests, req)
			return nil
		})
}

// editRequests changes a requests note by compare-and-set, reading it
// again after a lost race; a note left empty is deleted.
func editRequests(ctx context.Context, board location.Board, key location.NoteKey, edit func(*messages.OperatorRequests) error) error {
	for {
		var list messages.OperatorRequests
		n, err := board.ReadNote(ctx, key)
		switch {
		case errors.Is(err, location.ErrNotFound):
		case err != nil:
			return roamerr.Keep(roamerr.ErrUnavailable, "read requests", err)
		default:
			if err := Decode(n.Value, &list); err != nil {
				return err
			}
		}
		if err := edit(&list); err != nil {
			return err
		}
		if len(list.Requests) == 0 {
			if n.Version == 0 {
				return nil
			}
			err = board.DeleteNote(ctx, key, n.Version)
		} else {
			b, merr := Encode(&list)
			if merr != nil {
				return fmt.Errorf("%w: %w", roamerr.ErrInvalidOperation, merr)
			}
			_, err = board.WriteNote(ctx, key, n.Version, b)
		}
		if err == nil {
			return nil
		}
		if !errors.Is(err, location.ErrConflict) {
			return roamerr.Keep(roamerr.ErrUnavailable, "write requests", err)
		}
	}
}

// Status reads the status of request id on a node lifecycle; NotFound
// before the node has taken the request.
func Status(ctx context.Context, board location.Board, mesh, rid, id string) (*messages.OperatorStatus, location.StoreVersion, error) {
	n, err := board.ReadNote(ctx, location.NoteKey{Mesh: mesh, NodeRid: rid, Name: StatusNote(id)})
	if err != nil {
		return nil, 0, roamerr.Keep(roamerr.ErrUnavailable, "read status", err)
	}
	var st messages.OperatorStatus
	return &st, n.Version, Decode(n.Value, &st)
}

// WatchStatus waits until the status of request id changes from version
// after (0: until it exists) and returns it.
func WatchStatus(ctx context.Context, board location.Board, mesh, rid, id string, after location.StoreVersion) (*messages.OperatorStatus, location.StoreVersion, error) {
	key := location.NoteKey{Mesh: mesh, NodeRid: rid, Name: StatusNote(id)}
	for {
		n, err := board.WatchNote(ctx, key, after)
		if err != nil {
			return nil, 0, roamerr.Keep(roamerr.ErrUnavailable, "watch status", err)
		}
		if n.Version == 0 {
			after = 0
			continue // deleted: wait for it again
		}
		var st messages.OperatorStatus
		return &st, n.Version, Decode(n.Value, &st)
	}
}

// Feed reads the moves note of a node lifecycle (empty when none).
func Feed(ctx context.Context, board location.Board, mesh, rid string) (*messages.MoveFeed, location.StoreVersion, error) {
	n, err := board.ReadNote(ctx, location.NoteKey{Mesh: mesh, NodeRid: rid, Name: MovesNote})
	if errors.Is(err, location.ErrNotFound) {
		return &messages.MoveFeed{}, 0, nil
	}
	if err != nil {
		return nil, 0, roamerr.Keep(roamerr.ErrUnavailable, "read moves", err)
	}
	var f messages.MoveFeed
	return &f, n.Version, Decode(n.Value, &f)
}

// WatchFeed waits until the moves note changes from version after.
func WatchFeed(ctx context.Context, board location.Board, mesh, rid string, after location.StoreVersion) (*messages.MoveFeed, location.StoreVersion, error) {
	n, err := board.WatchNote(ctx, location.NoteKey{Mesh: mesh, NodeRid: rid, Name: MovesNote}, after)
	if err != nil {
		return nil, 0, roamerr.Keep(roamerr.ErrUnavailable, "watch moves", err)
	}
	if n.Version == 0 {
		return &messages.MoveFeed{}, 0, nil
	}
	var f messages.MoveFeed
	return &f, n.Version, Decode(n.Value, &f)
}
