package roam_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/internal/operator"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/messages"
)

// An operator drains a node and moves an object through the store alone
// (roamctl): the node runs each request once, reports it in its status
// note, and its moves show in the moves notes of their targets.
func TestOperatorRequestsThroughTheStore(t *testing.T) {
	bothStores(t, func(t *testing.T, store location.Store) {
		ctx := context.Background()
		board := store.(location.Board)
		a := start(t, store, roam.WithNodeName("node-a"))
		b := start(t, store, roam.WithNodeName("node-b"))
		for i := range 10 {
			_, err := a.SpawnActor(ctx, "counter", fmt.Sprintf("u-%d", i))
			require.NoError(t, err)
		}
		nodes, err := store.ListNodes(ctx, "")
		require.NoError(t, err)
		mesh := nodes[0].Node.GetMesh()

		// A move, asked of the owner.
		req := &messages.OperatorRequest{Id: "move-1", NodeRid: a.NodeRid(), RequestedBy: "test",
			Op: &messages.OperatorRequest_Move{Move: &messages.MoveOp{Kind: location.KindActor, Id: "u-0", Target: "node-b"}}}
		require.NoError(t, operator.Submit(ctx, board, mesh, req))
		st := waitFinished(t, board, mesh, a.NodeRid(), "move-1")
		require.Equal(t, messages.OperatorState_OPERATOR_STATE_DONE, st.GetState(), st.GetError())
		require.EqualValues(t, 1, st.GetMoved())
		require.Equal(t, b.NodeRid(), unitOwners(t, store)[roam.ActorRef("u-0")])

		// A drain.
		req = &messages.OperatorRequest{Id: "drain-1", NodeRid: a.NodeRid(), RequestedBy: "test",
			Op: &messages.OperatorRequest_Drain{Drain: &messages.DrainOp{Concurrency: 4}}}
		require.NoError(t, operator.Submit(ctx, board, mesh, req))
		st = waitFinished(t, board, mesh, a.NodeRid(), "drain-1")
		require.Equal(t, messages.OperatorState_OPERATOR_STATE_DONE, st.GetState(), st.GetError())
		require.EqualValues(t, 9, st.GetTotal())
		require.EqualValues(t, 9, st.GetMoved())
		require.Zero(t, st.GetFailed())
		for ref, owner := range unitOwners(t, store) {
			require.Equal(t, b.NodeRid(), owner, "%s", ref)
		}
		// The requests note is emptied once every request finished (the
		// final status is written first, then the request taken off); one
		// for a lifecycle that is not in the store waits for nobody (a sweep
		// at a node's start removes it).
		testwait.For(t, func() bool {
			_, err := board.ReadNote(ctx, location.NoteKey{Mesh: mesh, NodeRid: a.NodeRid(), Name: operator.RequestsNote})
			return errors.Is(err, location.ErrNotFound)
		}, "the finished requests stay in the requests note")
		req = &messages.OperatorRequest{Id: "stale-1", NodeRid: "someone-else", Op: &messages.OperatorRequest_Drain{Drain: &messages.DrainOp{}}}
		require.NoError(t, operator.Submit(ctx, board, mesh, req))
		_, err = board.ReadNote(ctx, location.NoteKey{Mesh: mesh, NodeRid: "someone-else", Name: operator.RequestsNote})
		require.NoError(t, err, "it waits for a lifecycle that never takes it")

		// Every move shows in b's moves note.
		testwait.For(t, func() bool {
			f, _, err := operator.Feed(ctx, board, mesh, b.NodeRid())
			return err == nil && len(f.GetMoves()) == 10
		}, "b's moves note lists the 10 moves")
	})
}

func waitFinished(t *testing.T, board location.Board, mesh, rid, id string) *messages.OperatorStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Patience(t))
	defer cancel()
	var after location.StoreVersion
	for {
		st, v, err := operator.WatchStatus(ctx, board, mesh, rid, id, after)
		require.NoError(t, err)
		if st.GetState() == messages.OperatorState_OPERATOR_STATE_DONE || st.GetState() == messages.OperatorState_OPERATOR_STATE_FAILED {
			return st
		}
		after = v
	}
}

// A node keeps the status notes of its last 32 requests only.
func TestOperatorStatusNotesAreBounded(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	a := start(t, store, roam.WithNodeName("node-a"))
	nodes, err := store.ListNodes(ctx, "")
	require.NoError(t, err)
	mesh := nodes[0].Node.GetMesh()
	for i := range 40 {
		req := &messages.OperatorRequest{Id: fmt.Sprintf("m-%02d", i), NodeRid: a.NodeRid(),
			Op: &messages.OperatorRequest_Move{Move: &messages.MoveOp{Kind: location.KindActor, Id: "nobody", Target: "node-a"}}}
		require.NoError(t, operator.Submit(ctx, store, mesh, req))
		st := waitFinished(t, store, mesh, a.NodeRid(), req.GetId())
		require.Equal(t, messages.OperatorState_OPERATOR_STATE_FAILED, st.GetState())
		require.Equal(t, "not_found", st.GetCode())
	}
	notes, err := store.ListNotes(ctx, mesh)
	require.NoError(t, err)
	statuses := 0
	for _, n := range notes {
		if strings.HasPrefix(n.Key.Name, "status-") {
			statuses++
		}
	}
	require.Equal(t, 32, statuses)
	_, err = store.ReadNote(ctx, location.NoteKey{Mesh: mesh, NodeRid: a.NodeRid(), Name: operator.StatusNote("m-39")})
	require.NoError(t, err, "the newest is kept")
}
