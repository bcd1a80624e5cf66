package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/messages"
)

// syncBuf is an output written from several goroutines.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testCtl is a ctl on store writing to out and errOut, with short waits.
func testCtl(store *memstore.Store) (c *ctl, out, errOut *syncBuf) {
	out, errOut = &syncBuf{}, &syncBuf{}
	c = newCtl(store, store, out)
	c.errOut = errOut
	c.who = "tester@test"
	c.liveEvery, c.discoverEvery, c.tick = 50*time.Millisecond, 20*time.Millisecond, 10*time.Millisecond
	return c, out, errOut
}

// manualStore is a memstore whose leases never expire on their own.
func manualStore() *memstore.Store {
	return memstore.New(memstore.WithClock(memstore.NewManualClock()))
}

var port = 7000

// claim makes a live node lifecycle in store, as a roam node's claim does.
func claim(t *testing.T, store location.Store, mesh, name string, capacity uint32) *location.NodeDescriptor {
	t.Helper()
	port++
	n := &location.NodeDescriptor{
		Mesh: mesh, NodeRid: uuid.NewString(), NodeGeneration: 1, EntrySpotId: mesh + "-" + name + "-entry",
		Address: fmt.Sprintf("127.0.0.1:%d", port), Capacity: capacity, Weight: 1,
		Status: messages.NodeStatus_NODE_STATUS_SERVING, ProtocolVersion: 1, Name: name,
	}
	lease, err := store.ClaimNode(context.Background(), n, time.Minute)
	require.NoError(t, err)
	n.LeaseId = string(lease.ID)
	return n
}

// put writes a Ready record of kind and id owned by owner.
func put(t *testing.T, store location.Store, kind location.Kind, id, typ string, owner *location.NodeDescriptor) {
	t.Helper()
	rec := &location.Record{
		ObjectGeneration: 3, AuthorityOwnerGeneration: 2,
		State: messages.LifecycleState_LIFECYCLE_STATE_READY, StableType: typ,
		Owner: &messages.Owner{Mesh: owner.GetMesh(), NodeRid: owner.GetNodeRid(), NodeGeneration: owner.GetNodeGeneration(), LeaseId: owner.GetLeaseId()},
	}
	switch kind {
	case location.KindInstanceSpot:
		rec.SpotKind = messages.SpotKind_SPOT_KIND_INSTANCE
	case location.KindUserSpot:
		rec.SpotKind = messages.SpotKind_SPOT_KIND_USER
	}
	_, err := store.CompareAndSet(context.Background(), location.Key(kind, id), 0, rec)
	require.NoError(t, err)
}

// drainingNode republishes n's descriptor as DRAINING.
func drainingNode(t *testing.T, store location.Store, n *location.NodeDescriptor) {
	t.Helper()
	ctx := context.Background()
	cur, err := store.ReadNode(ctx, location.NodeKeyOf(n))
	require.NoError(t, err)
	next := cur.Node
	next.Status = messages.NodeStatus_NODE_STATUS_DRAINING
	_, err = store.UpdateNode(ctx, next, cur.Version)
	require.NoError(t, err)
}

// fixture: node-a (capacity 100) owns two Actors, an Instance Spot and a
// User Spot; node-b (unbounded, draining) one Actor and the Instance Spot
// "shared"; an ended lifecycle still owns the Actor "orphan". "shared" is
// also an Actor's ID, on node-a.
func fixture(t *testing.T) (store *memstore.Store, a, b, gone *location.NodeDescriptor) {
	store = manualStore()
	a = claim(t, store, "default", "node-a", 100)
	b = claim(t, store, "default", "node-b", 0)
	gone = claim(t, store, "default", "node-gone", 10)
	put(t, store, location.KindActor, "walker", "counter", a)
	put(t, store, location.KindActor, "shared", "counter", a)
	put(t, store, location.KindInstanceSpot, "room-1", "room", a)
	put(t, store, location.KindUserSpot, "lobby", "", a)
	put(t, store, location.KindActor, "runner", "counter", b)
	put(t, store, location.KindInstanceSpot, "shared", "room", b)
	put(t, store, location.KindActor, "orphan", "counter", gone)
	require.NoError(t, store.ReleaseNode(context.Background(), gone))
	drainingNode(t, store, b)
	return store, a, b, gone
}

// lines splits output into its lines' whitespace-separated fields.
func lines(s string) [][]string {
	var out [][]string
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		out = append(out, strings.Fields(l))
	}
	return out
}

func TestNodesListsLiveNodesWithLoadAndCapacity(t *testing.T) {
	store, a, b, _ := fixture(t)
	c, out, _ := testCtl(store)
	require.NoError(t, c.Nodes(context.Background()))
	t.Logf("\n%s", out)
	require.Equal(t, [][]string{
		{"NAME", "RID", "STATE", "GEN", "LEASE", "ADDRESS", "LOAD/CAP"},
		{"node-a", a.NodeRid, "SERVING", "1", short(a.LeaseId), a.Address, "4/100"},
		{"node-b", b.NodeRid, "DRAINING", "1", short(b.LeaseId), b.Address, "2/-"},
	}, lines(out.String()))

	c, out, _ = testCtl(store)
	c.json = true
	require.NoError(t, c.Nodes(context.Background()))
	var doc struct{ Nodes []nodeJSON }
	require.NoError(t, json.Unmarshal([]byte(out.String()), &doc))
	require.Len(t, doc.Nodes, 2)
	require.Equal(t, nodeJSON{
		Mesh: "default", Name: "node-a", Rid: a.NodeRid, State: "SERVING", NodeGeneration: 1, LeaseID: a.LeaseId,
		Address: a.Address, Load: 4, LoadByKind: map[string]int{"actor": 2, "instance_spot": 1, "user_spot": 1}, Capacity: 100,
	}, doc.Nodes[0])
	require.Equal(t, 2, doc.Nodes[1].Load)
	require.Equal(t, uint32(0), doc.Nodes[1].Capacity)
}

func TestNodesShowsTheMeshWhenThereAreSeveral(t *testing.T) {
	store := manualStore()
	claim(t, store, "blue", "n1", 0)
	claim(t, store, "green", "n1", 0)
	c, out, _ := testCtl(store)
	require.NoError(t, c.Nodes(context.Background()))
	l := lines(out.String())
	require.Equal(t, "MESH", l[0][0])
	require.Equal(t, []string{"blue", "n1"}, l[1][:2])
	require.Equal(t, []string{"green", "n1"}, l[2][:2])

	// A name in two meshes is ambiguous without -mesh.
	err := c.Ls(context.Background(), "n1")
	require.Equal(t, exitUsage, codeOf(err))
	c.mesh = "green"
	require.NoError(t, c.Ls(context.Background(), "n1"))
}

func codeOf(err error) int {
	var e *exitError
	if errors.As(err, &e) {
		return e.code
	}
	if err == nil {
		return exitOK
	}
	return -1
}

func TestWhereShowsEveryKindAndTheOwner(t *testing.T) {
	store, a, b, gone := fixture(t)
	c, out, _ := testCtl(store)
	require.NoError(t, c.Where(context.Background(), "shared"))
	t.Logf("\n%s", out)
	require.Equal(t, [][]string{
		{"KIND", "STATE", "OWNER", "OBJ-GEN", "OWNER-GEN", "TYPE"},
		{"instance_spot", "READY", "node-b", "3", "2", "room"},
		{"actor", "READY", "node-a", "3", "2", "counter"},
	}, lines(out.String()))

	c, out, _ = testCtl(store)
	require.NoError(t, c.Where(context.Background(), "orphan"))
	require.Equal(t, []string{"actor", "READY", "(ended)", "3", "2", "counter"}, lines(out.String())[1])

	c, out, _ = testCtl(store)
	require.NoError(t, c.Where(context.Background(), "default-node-a-entry"))
	require.Equal(t, []string{"entry", "READY", "node-a", "1", "1", "-"}, lines(out.String())[1])

	c, out, _ = testCtl(store)
	c.json = true
	require.NoError(t, c.Where(context.Background(), "shared"))
	var doc struct {
		ID      string
		Records []recordJSON
	}
	require.NoError(t, json.Unmarshal([]byte(out.String()), &doc))
	require.Equal(t, "shared", doc.ID)
	require.Equal(t, []recordJSON{
		{Kind: "instance_spot", ID: "shared", State: "READY", Owner: "node-b", OwnerRid: b.NodeRid, OwnerMesh: "default",
			OwnerNodeGeneration: 1, OwnerLive: true, ObjectGeneration: 3, AuthorityOwnerGeneration: 2, StableType: "room"},
		{Kind: "actor", ID: "shared", State: "READY", Owner: "node-a", OwnerRid: a.NodeRid, OwnerMesh: "default",
			OwnerNodeGeneration: 1, OwnerLive: true, ObjectGeneration: 3, AuthorityOwnerGeneration: 2, StableType: "counter"},
	}, doc.Records)

	c, out, _ = testCtl(store)
	c.json = true
	require.NoError(t, c.Where(context.Background(), "orphan"))
	require.Contains(t, out.String(), `"owner_rid":"`+gone.NodeRid+`"`)
	require.Contains(t, out.String(), `"owner_live":false`)
}

func TestWhereNotFoundExitsOne(t *testing.T) {
	store, _, _, _ := fixture(t)
	c, _, _ := testCtl(store)
	err := c.Where(context.Background(), "nobody")
	require.Equal(t, exitFailed, codeOf(err))
	require.ErrorContains(t, err, "not found")
	errOut := &bytes.Buffer{}
	require.Equal(t, exitFailed, exitCode(errOut, err))
	require.Equal(t, "roamctl: \"nobody\": no record under any kind (not found)\n", errOut.String())
}

func TestLsListsWhatANodeOwnsSorted(t *testing.T) {
	store, a, _, gone := fixture(t)
	c, out, _ := testCtl(store)
	require.NoError(t, c.Ls(context.Background(), "node-a"))
	t.Logf("\n%s", out)
	want := [][]string{
		{"KIND", "ID", "TYPE", "STATE"},
		{"actor", "shared", "counter", "READY"},
		{"actor", "walker", "counter", "READY"},
		{"entry", "default-node-a-entry", "-", "READY"},
		{"instance_spot", "room-1", "room", "READY"},
		{"user_spot", "lobby", "-", "READY"},
	}
	require.Equal(t, want, lines(out.String()))

	c, out, _ = testCtl(store)
	require.NoError(t, c.Ls(context.Background(), a.NodeRid)) // by RID
	require.Equal(t, want, lines(out.String()))

	c, out, _ = testCtl(store)
	c.json = true
	require.NoError(t, c.Ls(context.Background(), "node-a"))
	var doc struct {
		Node    map[string]any
		Objects []recordJSON
	}
	require.NoError(t, json.Unmarshal([]byte(out.String()), &doc))
	require.Equal(t, "node-a", doc.Node["name"])
	require.Equal(t, true, doc.Node["live"])
	require.Len(t, doc.Objects, 5)
	require.Equal(t, "shared", doc.Objects[0].ID)

	// An ended lifecycle's RID lists the records it still owns.
	c, out, _ = testCtl(store)
	require.NoError(t, c.Ls(context.Background(), gone.NodeRid))
	require.Contains(t, out.String(), "no live node")
	require.Equal(t, []string{"actor", "orphan", "counter", "READY"}, lines(out.String())[2])

	c, _, _ = testCtl(store)
	require.Equal(t, exitFailed, codeOf(c.Ls(context.Background(), "node-x")))
}

func TestFlagsBeforeAndAfterTheCommand(t *testing.T) {
	var stdout, stderr bytes.Buffer
	inv, _ := parse([]string{"-prefix", "p1", "--mesh=m1", "move", "walker", "-kind", "actor", "node-b", "--json", "-timeout", "3s"}, &stdout, &stderr)
	require.NotNil(t, inv, stderr.String())
	require.Equal(t, "move", inv.cmd.name)
	require.Equal(t, []string{"walker", "node-b"}, inv.args)
	require.Equal(t, "actor", inv.flags.kind)
	require.Equal(t, "p1", inv.globals.prefix)
	require.Equal(t, "m1", inv.globals.mesh)
	require.True(t, inv.globals.json)
	require.Equal(t, 3*time.Second, inv.globals.timeout)

	// After the command wins; "--" ends the flags.
	inv, _ = parse([]string{"-mesh", "m1", "where", "-mesh", "m2", "--", "-odd-id"}, &stdout, &stderr)
	require.NotNil(t, inv, stderr.String())
	require.Equal(t, "m2", inv.globals.mesh)
	require.Equal(t, []string{"-odd-id"}, inv.args)

	t.Setenv("ROAM_PREFIX", "from-env")
	inv, _ = parse([]string{"nodes"}, &stdout, &stderr)
	require.Equal(t, "from-env", inv.globals.prefix)

	for _, bad := range [][]string{{}, {"nope"}, {"where"}, {"move", "x"}, {"drain", "a", "b"}, {"nodes", "-bogus"}} {
		inv, code := parse(bad, &stdout, &stderr)
		require.Nil(t, inv, bad)
		require.Equal(t, exitUsage, code, bad)
	}
	inv, code := parse([]string{"help"}, &stdout, &stderr)
	require.Nil(t, inv)
	require.Equal(t, exitOK, code)
	for _, c := range commands {
		require.Contains(t, stdout.String(), "  "+c.name)
	}
	require.Contains(t, stdout.String(), "CONSUL_HTTP_TOKEN_FILE")
	require.Equal(t, exitUsage, run([]string{"ls"}, &stdout, &stderr)) // no --node
}

// The objects of ended owners are listed — what an operator is alerted
// to: roamctl nodes counts them, roamctl ended lists them, and the web
// view's state carries them.
func TestEndedListsTheObjectsOfEndedOwners(t *testing.T) {
	store, _, _, gone := fixture(t)
	c, out, _ := testCtl(store)
	require.NoError(t, c.Ended(context.Background()))
	t.Logf("\n%s", out)
	got := lines(out.String())
	require.Equal(t, []string{"KIND", "ID", "TYPE", "STATE", "ENDED", "OWNER"}, got[0])
	require.Equal(t, []string{"actor", "orphan", "counter", "READY", gone.NodeRid}, got[1])
	require.Len(t, got, 3, "the header, the one object, the note")

	c, out, _ = testCtl(store)
	c.json = true
	require.NoError(t, c.Ended(context.Background()))
	var doc struct{ Objects []recordJSON }
	require.NoError(t, json.Unmarshal([]byte(out.String()), &doc))
	require.Len(t, doc.Objects, 1)
	require.Equal(t, "orphan", doc.Objects[0].ID)
	require.False(t, doc.Objects[0].OwnerLive)

	c, _, errOut := testCtl(store)
	require.NoError(t, c.Nodes(context.Background()))
	require.Contains(t, errOut.String(), "1 objects of ended owners are not served")

	c, _, _ = testCtl(store)
	s, err := c.webState(context.Background())
	require.NoError(t, err)
	require.Len(t, s.Ended, 1)
	require.Equal(t, "orphan", s.Ended[0].ID)
}
