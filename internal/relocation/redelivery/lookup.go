package redelivery

import (
	"errors"
	"fmt"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// LookupEnv is a node's primitives for Lookup. Every answer comes through
// a callback: the driver's block and call back before they return, a
// simulation's answer from its event queue.
type LookupEnv interface {
	// Self is this node's descriptor.
	Self() *location.NodeDescriptor
	// Read reads an object's record.
	Read(key location.AuthorityKey, done func(location.Versioned, error))
	// ReadNode reads a node's descriptor.
	ReadNode(key location.NodeKey, done func(location.VersionedNode, error))
}

// Lookup finds where a message to key is delivered again: the object's
// owner record, whatever its state, and the address of its owner's node.
// A missing record is roamerr.ErrNotFound (final: the message fails); an
// owner's node that is gone is Unavailable (another node takes the object
// over, docs/PROTOCOL.md §7.10: looked up again within the window), and
// so is a store that cannot answer.
func Lookup(env LookupEnv, key location.AuthorityKey, done func(v location.Versioned, address string, err error)) {
	env.Read(key, func(v location.Versioned, err error) {
		if err != nil {
			if errors.Is(err, location.ErrNotFound) {
				done(location.Versioned{}, "", fmt.Errorf("%w: %s", roamerr.ErrNotFound, key))
				return
			}
			done(location.Versioned{}, "", roamerr.Keep(roamerr.ErrUnavailable, "resolve "+key.String(), err))
			return
		}
		owner := v.Record.GetOwner()
		if self := env.Self(); owner.GetNodeRid() == self.GetNodeRid() {
			done(v, self.GetAddress(), nil)
			return
		}
		env.ReadNode(location.NodeKey{Mesh: owner.GetMesh(), NodeRid: owner.GetNodeRid()}, func(n location.VersionedNode, err error) {
			switch {
			case errors.Is(err, location.ErrNotFound):
				done(location.Versioned{}, "", fmt.Errorf("%w: node %s, the owner of %s, is gone", roamerr.ErrUnavailable, owner.GetNodeRid(), key))
			case err != nil:
				done(location.Versioned{}, "", roamerr.Keep(roamerr.ErrUnavailable, "node "+owner.GetNodeRid(), err))
			default:
				done(v, n.Node.GetAddress(), nil)
			}
		})
	})
}
