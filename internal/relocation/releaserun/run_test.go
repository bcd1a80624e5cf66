package releaserun

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/liveness"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

const ttl = 10 * time.Second

// env is a store holding at most one other lifecycle's descriptor, with
// scripted answers.
type env struct {
	self     *location.NodeDescriptor
	ended    bool
	fenced   bool
	node     *location.VersionedNode // nil: gone
	readErr  error                   // answers ReadNode instead
	revokeAt []location.StoreVersion // revocations asked
	revoke   error                   // RevokeLease's answer
	watch    *liveness.Watch
	now      time.Duration
	logged   int
}

func newEnv() *env {
	return &env{
		self:  &location.NodeDescriptor{NodeRid: "n1", NodeGeneration: 1, LeaseId: "l1", Address: "a1"},
		node:  &location.VersionedNode{Node: &location.NodeDescriptor{NodeRid: "n2", NodeGeneration: 1, LeaseId: "l2", Address: "a2"}, Version: 7},
		watch: liveness.New(ttl),
	}
}

func (e *env) Self() (*location.NodeDescriptor, bool) { return e.self, !e.ended }

func (e *env) ReadNode(o *messages.Owner, done func(location.VersionedNode, error)) {
	switch {
	case e.readErr != nil:
		done(location.VersionedNode{}, e.readErr)
	case e.node == nil:
		done(location.VersionedNode{}, location.ErrNotFound)
	default:
		done(*e.node, nil)
	}
}

func (e *env) RevokeLease(n location.VersionedNode, done func(error)) {
	e.revokeAt = append(e.revokeAt, n.Version)
	done(e.revoke)
}

func (e *env) Watch(f func(*liveness.Watch, time.Duration)) { f(e.watch, e.now) }

func (e *env) Serving() error {
	if e.fenced {
		return location.ErrUnavailable
	}
	return nil
}

func (e *env) LeaseRevoked(location.VersionedNode) { e.logged++ }

var owner = &messages.Owner{NodeRid: "n2", NodeGeneration: 1, LeaseId: "l2"}

type answer struct {
	addr  string
	alive bool
	err   error
}

func ownerNode(e *env, o *messages.Owner) answer {
	var a answer
	called := 0
	OwnerNode(e, o, func(addr string, alive bool, err error) { a, called = answer{addr, alive, err}, called+1 })
	if called != 1 {
		panic("OwnerNode answered more or less than once")
	}
	return a
}

// This node's own lifecycle is alive while it holds its lease, and only
// in its own generation.
func TestOwnerNodeSelf(t *testing.T) {
	e := newEnv()
	self := &messages.Owner{NodeRid: "n1", NodeGeneration: 1, LeaseId: "l1"}
	require.Equal(t, answer{"a1", true, nil}, ownerNode(e, self))
	require.Equal(t, answer{"a1", false, nil}, ownerNode(e, &messages.Owner{NodeRid: "n1", NodeGeneration: 0}))
	e.ended = true
	require.Equal(t, answer{"a1", false, nil}, ownerNode(e, self))
}

// A descriptor that heartbeats is alive; one of another lease or
// generation is a later lifecycle (the owner ended); a revoked lease is
// an ended owner at once.
func TestOwnerNodeDescriptor(t *testing.T) {
	e := newEnv()
	require.Equal(t, answer{"a2", true, nil}, ownerNode(e, owner))
	require.Equal(t, answer{"a2", false, nil}, ownerNode(e, &messages.Owner{NodeRid: "n2", NodeGeneration: 1, LeaseId: "l0"}))
	require.Equal(t, answer{"a2", false, nil}, ownerNode(e, &messages.Owner{NodeRid: "n2", NodeGeneration: 0, LeaseId: "l2"}))
	e.readErr = location.ErrLeaseRevoked
	require.Equal(t, answer{"", false, nil}, ownerNode(e, owner))
	e.readErr = location.ErrIndeterminate
	a := ownerNode(e, owner)
	require.ErrorIs(t, a.err, location.ErrIndeterminate, "the store's error, unclassified")
	require.Empty(t, e.revokeAt)
}

// A descriptor gone without a revocation is an ended owner only once
// this node has seen it gone for the lease TTL.
func TestOwnerNodeGone(t *testing.T) {
	e := newEnv()
	e.node = nil
	a := ownerNode(e, owner)
	require.ErrorIs(t, a.err, roamerr.ErrOwnerEnding)
	require.ErrorIs(t, a.err, roamerr.ErrUnavailable)
	e.now += ttl - 1
	require.ErrorIs(t, ownerNode(e, owner).err, roamerr.ErrOwnerEnding)
	e.now++
	require.Equal(t, answer{"", false, nil}, ownerNode(e, owner))
}

// A descriptor that stood still for its TTL has its lease revoked at the
// version seen: the owner ended, and a gone descriptor of it counts as
// ended at once from then on.
func TestOwnerNodeSilentRevoked(t *testing.T) {
	e := newEnv()
	require.True(t, ownerNode(e, owner).alive)
	e.now += ttl
	require.Equal(t, answer{"a2", false, nil}, ownerNode(e, owner))
	require.Equal(t, []location.StoreVersion{7}, e.revokeAt)
	require.Equal(t, 1, e.logged)
	e.node = nil
	require.Equal(t, answer{"", false, nil}, ownerNode(e, owner), "revoked: no TTL of watching it gone")
}

// A renewal that landed before the revoke wins: the owner is alive, and
// a revoke that another node made first ends it without this node
// logging one.
func TestOwnerNodeSilentRenewed(t *testing.T) {
	e := newEnv()
	ownerNode(e, owner)
	e.now += ttl
	e.revoke = &location.ConflictError{Op: "revoke lease"}
	require.Equal(t, answer{"a2", true, nil}, ownerNode(e, owner))
	e.revoke = location.ErrLeaseRevoked
	require.Equal(t, answer{"a2", false, nil}, ownerNode(e, owner))
	require.Zero(t, e.logged)
	e.revoke = location.ErrIndeterminate
	a := ownerNode(e, owner)
	require.ErrorIs(t, a.err, roamerr.ErrUnavailable)
	require.ErrorIs(t, a.err, location.ErrIndeterminate)
}

// A descriptor gone between the read and the revoke is judged as any
// missing owner: ending, then ended once seen gone for the TTL.
func TestOwnerNodeGoneAtRevoke(t *testing.T) {
	e := newEnv()
	ownerNode(e, owner)
	e.now += ttl
	e.revoke = location.ErrNotFound
	require.ErrorIs(t, ownerNode(e, owner).err, roamerr.ErrOwnerEnding)
	e.node = nil
	e.now += ttl - 1
	require.ErrorIs(t, ownerNode(e, owner).err, roamerr.ErrOwnerEnding)
	e.now++
	require.Equal(t, answer{"", false, nil}, ownerNode(e, owner), "gone for a TTL since the revoke found it gone")
}

// A fenced node revokes nothing: the owner is ending for it.
func TestOwnerNodeFencedRevokesNothing(t *testing.T) {
	e := newEnv()
	ownerNode(e, owner)
	e.now += ttl
	e.fenced = true
	a := ownerNode(e, owner)
	require.ErrorIs(t, a.err, roamerr.ErrOwnerEnding)
	require.ErrorIs(t, a.err, location.ErrUnavailable, "why it may not write")
	require.Empty(t, e.revokeAt)
}

// WatchNodes watches every descriptor listed but this node's own, and
// revokes those that stood still for their TTL.
func TestWatchNodes(t *testing.T) {
	e := newEnv()
	other := location.VersionedNode{Node: &location.NodeDescriptor{NodeRid: "n3", LeaseId: "l3"}, Version: 3}
	listing := []location.VersionedNode{{Node: e.self, Version: 1}, *e.node, other}
	watch := func() (n int, err error) {
		WatchNodes(e, listing, func(r int, er error) { n, err = r, er })
		return n, err
	}
	n, err := watch()
	require.NoError(t, err)
	require.Zero(t, n)
	e.now += ttl
	listing[2].Version = 4 // n3 heartbeats
	n, err = watch()
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, []location.StoreVersion{7}, e.revokeAt)

	e.now += ttl
	e.revoke = errors.New("store down")
	n, err = watch()
	require.ErrorIs(t, err, roamerr.ErrUnavailable)
	require.Zero(t, n)
}

// An owner whose descriptor is missing at the revoke and who has been
// seen gone for its TTL already is ended, not alive. Only a zero TTL
// reaches it here (every read that finds the descriptor restarts its
// time gone), so the watch has none.
func TestOwnerNodeGoneForATTLAtRevokeIsEnded(t *testing.T) {
	e := newEnv()
	e.watch = liveness.New(0)
	require.True(t, ownerNode(e, owner).alive, "first sight")
	e.revoke = location.ErrNotFound
	require.Equal(t, answer{"a2", false, nil}, ownerNode(e, owner))
	require.Equal(t, []location.StoreVersion{7}, e.revokeAt)
}
