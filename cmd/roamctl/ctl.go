package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

// ctl runs the commands against a store, its board and an output; the
// tests build one on memstore.
type ctl struct {
	store  location.Store
	board  location.Board
	out    io.Writer
	errOut io.Writer

	mesh   string // "" = every mesh
	prefix string // the store's key prefix, for messages ("" unknown)
	// prefixes lists the other key prefixes of the store that have live
	// nodes (nil: the store cannot tell), for the hint of a look that
	// found none.
	prefixes func(ctx context.Context) ([]string, error)
	json     bool          // machine output
	tty      bool          // out is a terminal: live progress bar
	timeout  time.Duration // 0 = none
	who      string        // requested_by

	now func() time.Time
	// liveEvery is how often a wait for a node's status checks that the
	// node is still live; discoverEvery how often watch lists the nodes;
	// tick how often the progress of a drain is printed.
	liveEvery, discoverEvery, tick time.Duration
	// webTimeout bounds one read of the store by the web view (0:
	// webReadTimeout).
	webTimeout time.Duration
	// grace is how long past a request's deadline roamctl still waits for
	// the node's final status.
	grace time.Duration
}

func newCtl(store location.Store, board location.Board, out io.Writer) *ctl {
	return &ctl{
		store: store, board: board, out: out, errOut: io.Discard,
		who: "roamctl", now: time.Now,
		liveEvery: 2 * time.Second, discoverEvery: 2 * time.Second, tick: time.Second,
		grace: 30 * time.Second,
	}
}

// readCtx bounds a read-only command by -timeout.
func (c *ctl) readCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if c.timeout > 0 {
		return context.WithTimeout(ctx, c.timeout)
	}
	return context.WithCancel(ctx)
}

// directory is the live nodes as one ListNodes read them.
type directory struct {
	nodes []location.VersionedNode
	byRid map[location.NodeKey]*location.NodeDescriptor
}

func (c *ctl) directory(ctx context.Context, mesh string) (*directory, error) {
	nodes, err := c.store.ListNodes(ctx, mesh)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	d := &directory{nodes: nodes, byRid: map[location.NodeKey]*location.NodeDescriptor{}}
	for _, n := range nodes {
		d.byRid[location.NodeKeyOf(n.Node)] = n.Node
	}
	return d, nil
}

// owner returns the live descriptor of an owner, nil when its lifecycle
// has ended (no descriptor, or one under another lease).
func (d *directory) owner(o *messages.Owner) *location.NodeDescriptor {
	n := d.byRid[location.NodeKey{Mesh: o.GetMesh(), NodeRid: o.GetNodeRid()}]
	if n == nil || n.GetNodeGeneration() != o.GetNodeGeneration() {
		return nil
	}
	if o.GetLeaseId() != "" && n.GetLeaseId() != "" && o.GetLeaseId() != n.GetLeaseId() {
		return nil
	}
	return n
}

// find returns the live node called arg: its name, RID or address.
func (d *directory) find(arg string) (*location.NodeDescriptor, error) {
	var found []*location.NodeDescriptor
	for _, match := range []func(*location.NodeDescriptor) bool{
		func(n *location.NodeDescriptor) bool { return n.GetNodeRid() == arg },
		func(n *location.NodeDescriptor) bool { return n.GetName() == arg },
		func(n *location.NodeDescriptor) bool { return n.GetAddress() == arg },
	} {
		for _, n := range d.nodes {
			if match(n.Node) {
				found = append(found, n.Node)
			}
		}
		if len(found) > 0 {
			break
		}
	}
	switch len(found) {
	case 0:
		return nil, failf(exitFailed, "no live node %q", arg)
	case 1:
		return found[0], nil
	}
	var meshes []string
	for _, n := range found {
		meshes = append(meshes, n.GetMesh())
	}
	return nil, failf(exitUsage, "%q names a node in each of the meshes %s: give -mesh", arg, strings.Join(meshes, ", "))
}

// nodeName is how a node is shown: its name, else its RID.
func nodeName(n *location.NodeDescriptor) string {
	if n.GetName() != "" {
		return n.GetName()
	}
	return n.GetNodeRid()
}

// short is the first 8 characters of a lease ID or RID.
func short(s string) string {
	if len(s) > 8 {
		return s[:8]
	}
	return s
}

// unitKinds are the kinds a node serves and moves: its load.
var unitKinds = []location.Kind{location.KindActor, location.KindInstanceSpot, location.KindUserSpot}

// whereKinds is the order where reads an ID in.
var whereKinds = []location.Kind{location.KindInstanceSpot, location.KindUserSpot, location.KindActor, location.KindEntry}

// scan calls fn with every record of the kinds, a page at a time.
func (c *ctl) scan(ctx context.Context, kinds []location.Kind, fn func(location.Versioned)) error {
	for _, k := range kinds {
		page := location.PageRequest{Size: location.MaxPageSize}
		for {
			p, err := c.store.List(ctx, k, page)
			if err != nil {
				return fmt.Errorf("list %s records: %w", location.KindName(k), err)
			}
			for _, v := range p.Items {
				fn(v)
			}
			if p.Next == "" {
				break
			}
			page.After = p.Next
		}
	}
	return nil
}

// parseKind reads a kind's short name (location.KindName).
func parseKind(s string) (location.Kind, error) {
	for _, k := range location.Kinds {
		if location.KindName(k) == s {
			return k, nil
		}
	}
	return 0, failf(exitUsage, "unknown kind %q (actor, instance_spot, user_spot, entry)", s)
}

func stateName(s messages.LifecycleState) string {
	return strings.TrimPrefix(s.String(), "LIFECYCLE_STATE_")
}

func nodeState(s messages.NodeStatus) string {
	return strings.TrimPrefix(s.String(), "NODE_STATUS_")
}

// notFound reports whether err is the store's NotFound.
func notFound(err error) bool { return errors.Is(err, location.ErrNotFound) }
