package redelivery

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// lookupEnv answers from one record and one other node's descriptor.
type lookupEnv struct {
	rec      error // the record read's error
	owner    string
	node     error // the node read's error
	readNode int
}

func (e *lookupEnv) Self() *location.NodeDescriptor {
	return &location.NodeDescriptor{NodeRid: "n1", Address: "a1"}
}

func (e *lookupEnv) Read(key location.AuthorityKey, done func(location.Versioned, error)) {
	if e.rec != nil {
		done(location.Versioned{}, e.rec)
		return
	}
	done(location.Versioned{Key: key, Version: 3, Record: &location.Record{Owner: &messages.Owner{NodeRid: e.owner}}}, nil)
}

func (e *lookupEnv) ReadNode(key location.NodeKey, done func(location.VersionedNode, error)) {
	e.readNode++
	if e.node != nil {
		done(location.VersionedNode{}, e.node)
		return
	}
	done(location.VersionedNode{Node: &location.NodeDescriptor{NodeRid: key.NodeRid, Address: "a2"}}, nil)
}

func lookup(e *lookupEnv) (v location.Versioned, addr string, err error) {
	Lookup(e, location.Key(location.KindInstanceSpot, "s"), func(vv location.Versioned, a string, er error) { v, addr, err = vv, a, er })
	return v, addr, err
}

// A redelivery goes to the record's owner (whatever the record's state)
// at its node's address; this node's own address without a read.
func TestLookupOwner(t *testing.T) {
	v, addr, err := lookup(&lookupEnv{owner: "n2"})
	require.NoError(t, err)
	require.Equal(t, "a2", addr)
	require.Equal(t, location.StoreVersion(3), v.Version)

	e := &lookupEnv{owner: "n1"}
	_, addr, err = lookup(e)
	require.NoError(t, err)
	require.Equal(t, "a1", addr)
	require.Zero(t, e.readNode)
}

// A missing record is final (NotFound, ResolveAgain stops); an owner's
// node that is gone, revoked or unreadable, and a store that cannot
// answer, are Unavailable: looked up again within the window.
func TestLookupErrors(t *testing.T) {
	_, _, err := lookup(&lookupEnv{rec: location.ErrNotFound})
	require.ErrorIs(t, err, roamerr.ErrNotFound)
	again, _ := ResolveAgain(err, 0)
	require.False(t, again)

	for _, e := range []*lookupEnv{
		{rec: location.ErrIndeterminate},
		{owner: "n2", node: location.ErrNotFound},
		{owner: "n2", node: location.ErrLeaseRevoked},
		{owner: "n2", node: location.ErrUnavailable},
	} {
		_, addr, err := lookup(e)
		require.ErrorIs(t, err, roamerr.ErrUnavailable, "%+v", e)
		require.NotErrorIs(t, err, roamerr.ErrNotFound, "%+v: not final", e)
		require.Empty(t, addr)
		again, _ := ResolveAgain(err, 0)
		require.True(t, again, "%+v", e)
	}
}
