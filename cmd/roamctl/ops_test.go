package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/internal/operator"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/messages"
)

// These tests play the node side of the board themselves (fakeNode), to
// check what roamctl asks and how it shows each answer; e2e_test.go runs
// the same commands against real roam nodes.

// fakeNode takes each new request from the requests note of lifecycle n
// and hands it to handle, as a roam node would.
type fakeNode struct {
	t     *testing.T
	store *memstore.Store
	n     *location.NodeDescriptor

	mu   sync.Mutex
	reqs []*messages.OperatorRequest
}

func serve(t *testing.T, store *memstore.Store, n *location.NodeDescriptor, handle func(f *fakeNode, req *messages.OperatorRequest)) *fakeNode {
	f := &fakeNode{t: t, store: store, n: n}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		key := location.NoteKey{Mesh: n.Mesh, NodeRid: n.NodeRid, Name: operator.RequestsNote}
		seen := map[string]bool{}
		var after location.StoreVersion
		for {
			note, err := store.WatchNote(ctx, key, after)
			if err != nil {
				return
			}
			after = note.Version
			var list messages.OperatorRequests
			if note.Version == 0 || operator.Decode(note.Value, &list) != nil {
				continue
			}
			for _, req := range list.Requests {
				if seen[req.Id] {
					continue
				}
				seen[req.Id] = true
				f.mu.Lock()
				f.reqs = append(f.reqs, req)
				f.mu.Unlock()
				if handle != nil {
					handle(f, req)
				}
			}
		}
	}()
	return f
}

func (f *fakeNode) requests() []*messages.OperatorRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*messages.OperatorRequest(nil), f.reqs...)
}

// status writes the status note of st's request.
func (f *fakeNode) status(st *messages.OperatorStatus) {
	writeNote(f.t, f.store, location.NoteKey{Mesh: f.n.Mesh, NodeRid: f.n.NodeRid, Name: operator.StatusNote(st.RequestId)},
		func(proto.Message) {}, st)
}

// writeNote replaces a note with m, after edit has changed m from the
// note's current content (read into m first, when there is one).
func writeNote(t *testing.T, store *memstore.Store, key location.NoteKey, edit func(proto.Message), m proto.Message) {
	ctx := context.Background()
	for {
		var version location.StoreVersion
		if n, err := store.ReadNote(ctx, key); err == nil {
			version = n.Version
		}
		edit(m)
		b, err := operator.Encode(m)
		if err != nil {
			t.Error(err)
			return
		}
		if _, err := store.WriteNote(ctx, key, version, b); !errors.Is(err, location.ErrConflict) {
			if err != nil {
				t.Error(err)
			}
			return
		}
	}
}

// moveOwner makes target the owner of key, as a committed move does.
func moveOwner(t *testing.T, store location.Store, key location.AuthorityKey, target *location.NodeDescriptor) {
	ctx := context.Background()
	v, err := store.Read(ctx, key)
	require.NoError(t, err)
	rec := proto.Clone(v.Record).(*location.Record)
	rec.AuthorityOwnerGeneration++
	rec.Owner = &messages.Owner{Mesh: target.Mesh, NodeRid: target.NodeRid, NodeGeneration: target.NodeGeneration, LeaseId: target.LeaseId}
	_, err = store.CompareAndSet(ctx, key, v.Version, rec)
	require.NoError(t, err)
}

func nodeByRid(t *testing.T, store location.Store, rid string) *location.NodeDescriptor {
	nodes, err := store.ListNodes(context.Background(), "")
	require.NoError(t, err)
	for _, n := range nodes {
		if n.Node.NodeRid == rid {
			return n.Node
		}
	}
	t.Fatalf("no node %s", rid)
	return nil
}

const ms25 = int64(2500 * time.Microsecond)

func TestMoveAsksTheOwnerAndShowsTheOutcome(t *testing.T) {
	store, a, b, _ := fixture(t)
	c3 := claim(t, store, "default", "node-c", 0)
	moves := func(f *fakeNode, req *messages.OperatorRequest) {
		m := req.GetMove()
		f.status(&messages.OperatorStatus{RequestId: req.Id, State: messages.OperatorState_OPERATOR_STATE_RUNNING, Total: 1})
		if m.GetTarget() == b.NodeRid {
			f.status(&messages.OperatorStatus{RequestId: req.Id, State: messages.OperatorState_OPERATOR_STATE_FAILED, Total: 1, Failed: 1,
				Error: "node node-b is draining", Code: "node_draining"})
			return
		}
		moveOwner(t, store, location.Key(m.Kind, m.Id), nodeByRid(t, store, m.Target))
		f.status(&messages.OperatorStatus{RequestId: req.Id, State: messages.OperatorState_OPERATOR_STATE_DONE, Total: 1, Moved: 1,
			PauseP50Nanos: ms25, PauseP99Nanos: ms25})
	}
	fa := serve(t, store, a, moves)
	ctx := context.Background()

	c, out, _ := testCtl(store)
	require.NoError(t, c.Move(ctx, "", "walker", "node-c"))
	require.Equal(t, "moved actor/\"walker\": node-a → node-c, pause 2.5ms\n", out.String())
	reqs := fa.requests()
	require.Len(t, reqs, 1)
	require.Equal(t, a.NodeRid, reqs[0].NodeRid)
	require.Equal(t, "tester@test", reqs[0].RequestedBy)
	require.Zero(t, reqs[0].DeadlineUnixNanos)
	require.NotEmpty(t, reqs[0].Id)
	require.True(t, proto.Equal(&messages.MoveOp{Kind: location.KindActor, Id: "walker", Target: c3.NodeRid}, reqs[0].GetMove()))
	v, err := store.Read(ctx, location.Key(location.KindActor, "walker"))
	require.NoError(t, err)
	require.Equal(t, c3.NodeRid, v.Record.Owner.NodeRid)

	// --json, a deadline, and the Instance Spot of an ID two kinds share.
	c, out, _ = testCtl(store)
	c.json, c.timeout = true, time.Minute
	require.Equal(t, exitUsage, codeOf(c.Move(ctx, "", "shared", "node-c")))
	serve(t, store, b, moves)
	require.NoError(t, c.Move(ctx, "instance_spot", "shared", "node-c"))
	var got moveJSON
	require.NoError(t, json.Unmarshal([]byte(out.String()), &got))
	require.Equal(t, moveJSON{Kind: "instance_spot", ID: "shared", From: "node-b", FromRid: b.NodeRid, To: "node-c", ToRid: c3.NodeRid,
		State: "DONE", PauseMs: 2.5, RequestID: got.RequestID}, got)

	// A failed move exits 1 with the node's error and code.
	c, out, _ = testCtl(store)
	err = c.Move(ctx, "actor", "shared", "node-b")
	require.Equal(t, exitFailed, codeOf(err))
	require.EqualError(t, err, `move of actor/"shared" from node-a to node-b failed: node node-b is draining (code node_draining)`)
	require.Empty(t, out.String())

	// Nothing to ask: not found, an ended owner, an unknown target, already there.
	c, out, _ = testCtl(store)
	require.Equal(t, exitFailed, codeOf(c.Move(ctx, "", "nobody", "node-b")))
	require.Equal(t, exitFailed, codeOf(c.Move(ctx, "", "orphan", "node-b")))
	require.Equal(t, exitFailed, codeOf(c.Move(ctx, "", "room-1", "node-x")))
	require.Equal(t, exitUsage, codeOf(c.Move(ctx, "entry", "default-node-a-entry", "node-b")))
	require.NoError(t, c.Move(ctx, "", "room-1", "node-a"))
	require.Equal(t, "instance_spot/\"room-1\" is on node-a already\n", out.String())
	require.Len(t, fa.requests(), 2)
}

// drainStatuses answers a drain with three units: two move, one cannot.
func drainStatuses(f *fakeNode, req *messages.OperatorRequest) {
	now := time.Now().UnixNano()
	st := &messages.OperatorStatus{RequestId: req.Id, State: messages.OperatorState_OPERATOR_STATE_RUNNING, Total: 3,
		StartedUnixNanos: now, UpdatedUnixNanos: now}
	f.status(st)
	st.Moved, st.UpdatedUnixNanos = 1, now+int64(500*time.Millisecond)
	f.status(st)
	st.Moved, st.Failed = 2, 1
	st.Failures = []*messages.UnitFailure{{Kind: location.KindActor, Id: "stuck", Error: "no node can take it", Code: "capacity_exceeded"}}
	st.State, st.UpdatedUnixNanos, st.FinishedUnixNanos = messages.OperatorState_OPERATOR_STATE_DONE, now+int64(time.Second), now+int64(time.Second)
	st.PauseP50Nanos, st.PauseP99Nanos = ms25, 4*ms25
	f.status(st)
}

func TestDrainFollowsProgressToTheSummary(t *testing.T) {
	store, a, _, _ := fixture(t)
	fa := serve(t, store, a, drainStatuses)
	ctx := context.Background()

	c, out, _ := testCtl(store)
	err := c.Drain(ctx, "node-a", 4)
	t.Logf("\n%s", out)
	require.Equal(t, exitFailed, codeOf(err))
	require.EqualError(t, err, "drain of node-a left 1 unit(s) on it")
	require.True(t, proto.Equal(&messages.DrainOp{Concurrency: 4}, fa.requests()[0].GetDrain()))
	text := out.String()
	require.True(t, strings.HasPrefix(text, "draining node-a (request "+fa.requests()[0].Id+")\n"), text)
	require.Contains(t, text, " 2/3 moved, 1 failed, 3.0 units/s, ETA 0s, elapsed ")
	require.True(t, strings.HasSuffix(text, "drain of node-a DONE in 1.0s: 2 moved, 1 failed, of 3\n"+
		"pause p50 2.5ms, p99 10.0ms\n"+
		"failed units:\n"+
		"  actor/\"stuck\": no node can take it (code capacity_exceeded)\n"), text)
	require.NotContains(t, text, "\r")

	// On a terminal, one line redrawn in place.
	c, out, _ = testCtl(store)
	c.tty = true
	require.Equal(t, exitFailed, codeOf(c.Drain(ctx, "node-a", 0)))
	require.Contains(t, out.String(), "\r[########################] 2/3 moved, 1 failed, 3.0 units/s, ETA 0s, elapsed ")

	// --json: the statuses, one a line, the last one final.
	c, out, _ = testCtl(store)
	c.json = true
	require.Equal(t, exitFailed, codeOf(c.Drain(ctx, a.NodeRid, 0)))
	ls := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.GreaterOrEqual(t, len(ls), 1)
	var last struct {
		Node    string
		NodeRid string `json:"node_rid"`
		Final   bool
		Status  *json.RawMessage
	}
	require.NoError(t, json.Unmarshal([]byte(ls[len(ls)-1]), &last))
	require.True(t, last.Final)
	var st messages.OperatorStatus
	require.NoError(t, operator.Decode(*last.Status, &st))
	require.Equal(t, uint32(2), st.Moved)
	require.Equal(t, "stuck", st.Failures[0].Id)
	for _, l := range ls[:len(ls)-1] {
		require.Contains(t, l, `"final":false`)
	}
}

func TestDrainInterruptedOrNodeEnded(t *testing.T) {
	store, a, b, _ := fixture(t)
	serve(t, store, a, nil) // takes requests, never answers
	c, out, _ := testCtl(store)
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Drain(ctx, "node-a", 0) }()
	testwait.For(t, func() bool { return strings.Contains(out.String(), "waiting for node-a") }, "drain waiting")
	cancel(errInterrupted)
	err := <-done
	require.Equal(t, exitInterrupted, codeOf(err))
	require.Contains(t, out.String(), "stopped watching; the drain of node-a continues on the node (request ")

	// The node's lifecycle ends before it answers.
	c, _, _ = testCtl(store)
	go func() { done <- c.Drain(context.Background(), "node-b", 0) }()
	testwait.For(t, func() bool {
		n, err := store.ReadNote(context.Background(), location.NoteKey{Mesh: b.Mesh, NodeRid: b.NodeRid, Name: operator.RequestsNote})
		return err == nil && n.Version > 0
	}, "drain request submitted")
	require.NoError(t, store.ReleaseNode(context.Background(), b))
	err = <-done
	require.ErrorIs(t, err, errNodeEnded)
	require.Equal(t, exitFailed, exitCode(&syncBuf{}, err))
}

func TestProgressLine(t *testing.T) {
	p := progress{total: 40, moved: 12, failed: 1, rate: 6.5, elapsed: 2100 * time.Millisecond}
	require.Equal(t, "[#######.................] 12/40 moved, 1 failed, 6.5 units/s, ETA 4.2s, elapsed 2.1s", p.bar())
	p = progress{}
	require.Equal(t, "[........................] 0/0 moved, 0 failed, - units/s, ETA -, elapsed 0s", p.bar())
	p = progress{total: 5}
	require.Equal(t, "0/5 moved, 0 failed, - units/s, ETA -, elapsed 0s", p.counts())

	var out strings.Builder
	l := &liveLine{w: &out}
	l.draw("long line")
	l.draw("short")
	l.end()
	require.Equal(t, "\rlong line\rshort    \n", out.String())
}

// feedKey is the moves note of n.
func feedKey(n *location.NodeDescriptor) location.NoteKey {
	return location.NoteKey{Mesh: n.Mesh, NodeRid: n.NodeRid, Name: operator.MovesNote}
}

// appendMove adds a move to target's feed, as a node that committed it does.
func appendMove(t *testing.T, store *memstore.Store, target *location.NodeDescriptor, m *messages.MoveRecord) {
	var f messages.MoveFeed
	writeNote(t, store, feedKey(target), func(pm proto.Message) {
		f.Reset()
		if n, err := store.ReadNote(context.Background(), feedKey(target)); err == nil {
			require.NoError(t, operator.Decode(n.Value, &f))
		}
		f.Seq++
		m.Seq = f.Seq
		m.ToRid = target.NodeRid
		f.Moves = append(f.Moves, m)
	}, &f)
}

func TestWatchPrintsNewMovesOfEveryNode(t *testing.T) {
	for _, asJSON := range []bool{false, true} {
		store, a, b, _ := fixture(t)
		now := time.Now()
		appendMove(t, store, b, &messages.MoveRecord{Kind: location.KindActor, Id: "old", FromRid: a.NodeRid, AtUnixNanos: now.Add(-time.Hour).UnixNano()})

		c, out, errOut := testCtl(store)
		c.json = asJSON
		c.now = func() time.Time { return now } // moves from now on are new
		done := make(chan error, 1)
		go func() { done <- c.Watch(context.Background(), 3) }()
		appendMove(t, store, b, &messages.MoveRecord{Kind: location.KindActor, Id: "walker", FromRid: a.NodeRid,
			PauseNanos: ms25, Bytes: 1536, AtUnixNanos: time.Now().UnixNano()})
		appendMove(t, store, a, &messages.MoveRecord{Kind: location.KindInstanceSpot, Id: "room-1", FromRid: b.NodeRid,
			PauseNanos: 4 * ms25, Bytes: 20, AtUnixNanos: time.Now().UnixNano(), Fallback: true})
		// A node that starts while watching.
		d := claim(t, store, "default", "node-d", 0)
		appendMove(t, store, d, &messages.MoveRecord{Kind: location.KindActor, Id: "runner", FromRid: b.NodeRid,
			PauseNanos: ms25, Bytes: 100, AtUnixNanos: time.Now().UnixNano()})
		require.NoError(t, <-done)
		t.Logf("\n%s", out)
		require.Empty(t, errOut.String())

		got := strings.Split(strings.TrimSpace(out.String()), "\n")
		require.Len(t, got, 3)
		require.NotContains(t, out.String(), "old")
		if !asJSON {
			var sorted []string
			for _, l := range got {
				sorted = append(sorted, l[len("15:04:05.000  "):])
			}
			require.ElementsMatch(t, []string{
				`actor/"walker"  node-a → node-b  pause 2.50ms  1.5 KiB`,
				`instance_spot/"room-1"  node-b → node-a  pause 10.00ms  20 B (fallback)`,
				`actor/"runner"  node-b → node-d  pause 2.50ms  100 B`,
			}, sorted)
			continue
		}
		byID := map[string]moveLine{}
		for _, l := range got {
			var m moveLine
			require.NoError(t, json.Unmarshal([]byte(l), &m))
			byID[m.ID] = m
		}
		w := byID["walker"]
		require.Equal(t, moveLine{At: w.At, Mesh: "default", Seq: 2, Kind: "actor", ID: "walker", From: "node-a", FromRid: a.NodeRid,
			To: "node-b", ToRid: b.NodeRid, PauseMs: 2.5, Bytes: 1536}, w)
		require.True(t, byID["room-1"].Fallback)
		require.Equal(t, "node-d", byID["runner"].To)
	}
}

func TestWatchSaysWhenTheFeedMovedOn(t *testing.T) {
	store, a, b, _ := fixture(t)
	c, out, errOut := testCtl(store)
	start := time.Now()
	c.now = func() time.Time { return start }
	done := make(chan error, 1)
	go func() { done <- c.Watch(context.Background(), 2) }()
	appendMove(t, store, b, &messages.MoveRecord{Kind: location.KindActor, Id: "first", FromRid: a.NodeRid, AtUnixNanos: time.Now().UnixNano()})
	testwait.For(t, func() bool { return strings.Contains(out.String(), "first") }, "first move shown")
	// Three moves more, of which the note keeps the last alone.
	var f messages.MoveFeed
	writeNote(t, store, feedKey(b), func(proto.Message) {
		f.Reset()
		f.Seq = 4
		f.Moves = []*messages.MoveRecord{{Seq: 4, Kind: location.KindActor, Id: "fourth", FromRid: a.NodeRid, ToRid: b.NodeRid, AtUnixNanos: time.Now().UnixNano()}}
	}, &f)
	require.NoError(t, <-done)
	require.Contains(t, out.String(), "fourth")
	require.Equal(t, "roamctl: 2 move(s) to node-b not shown: its moves note had moved on\n", errOut.String())
}
