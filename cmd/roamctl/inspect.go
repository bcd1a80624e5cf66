package main

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"

	"github.com/roamactors/roam/location"
)

// nodeJSON is one node of `nodes --json`.
type nodeJSON struct {
	Mesh           string         `json:"mesh"`
	Name           string         `json:"name"`
	Rid            string         `json:"rid"`
	State          string         `json:"state"`
	NodeGeneration uint64         `json:"node_generation"`
	LeaseID        string         `json:"lease_id"`
	Address        string         `json:"address"`
	Load           int            `json:"load"`
	LoadByKind     map[string]int `json:"load_by_kind"`
	Capacity       uint32         `json:"capacity"` // 0: unbounded
}

// Nodes prints every live node with its load: the Actors, Instance Spots
// and User Spots it owns.
func (c *ctl) Nodes(ctx context.Context) error {
	ctx, cancel := c.readCtx(ctx)
	defer cancel()
	out, _, ended, err := c.nodeLoads(ctx)
	if err != nil {
		return err
	}
	if len(ended) > 0 && !c.json {
		defer fmt.Fprintf(c.errOut, "roamctl: %d objects of ended owners are not served (roamctl ended lists them)\n", len(ended))
	}
	meshes := map[string]bool{}
	for _, j := range out {
		meshes[j.Mesh] = true
	}
	if c.json {
		if out == nil {
			out = []nodeJSON{}
		}
		if err := writeJSON(c.out, map[string]any{"nodes": out}); err != nil || len(out) > 0 {
			return err
		}
	}
	if len(out) == 0 {
		return c.noLiveNodes(ctx)
	}
	withMesh := len(meshes) > 1
	header := []string{"NAME", "RID", "STATE", "GEN", "LEASE", "ADDRESS", "LOAD/CAP"}
	if withMesh {
		header = append([]string{"MESH"}, header...)
	}
	rows := [][]string{header}
	for _, j := range out {
		capacity := "-"
		if j.Capacity > 0 {
			capacity = strconv.Itoa(int(j.Capacity))
		}
		name := j.Name
		if name == "" {
			name = "-"
		}
		r := []string{name, j.Rid, j.State, strconv.FormatUint(j.NodeGeneration, 10), short(j.LeaseID), j.Address,
			strconv.Itoa(j.Load) + "/" + capacity}
		if withMesh {
			r = append([]string{j.Mesh}, r...)
		}
		rows = append(rows, r)
	}
	return table(c.out, rows)
}

// nodeLoads is every live node with its load (the Actors, Instance Spots
// and User Spots it owns), by mesh and name, the directory it read, and
// the objects whose owner is no live node (ended: waiting for their
// recovery, or for an operator).
func (c *ctl) nodeLoads(ctx context.Context) ([]nodeJSON, *directory, []recordJSON, error) {
	dir, err := c.directory(ctx, c.mesh)
	if err != nil {
		return nil, nil, nil, err
	}
	load := map[location.NodeKey]map[location.Kind]int{}
	ended := []recordJSON{}
	err = c.scan(ctx, unitKinds, func(v location.Versioned) {
		o := v.Record.GetOwner()
		if dir.owner(o) == nil && (c.mesh == "" || o.GetMesh() == c.mesh) {
			ended = append(ended, recordOf(v, dir))
		}
		k := location.NodeKey{Mesh: o.GetMesh(), NodeRid: o.GetNodeRid()}
		if load[k] == nil {
			load[k] = map[location.Kind]int{}
		}
		load[k][v.Key.Kind]++
	})
	if err != nil {
		return nil, nil, nil, err
	}
	sort.Slice(ended, func(i, j int) bool {
		if ended[i].Kind != ended[j].Kind {
			return ended[i].Kind < ended[j].Kind
		}
		return ended[i].ID < ended[j].ID
	})
	nodes := slices.Clone(dir.nodes)
	sort.SliceStable(nodes, func(i, j int) bool { // by mesh and name
		a, b := nodes[i].Node, nodes[j].Node
		if a.GetMesh() != b.GetMesh() {
			return a.GetMesh() < b.GetMesh()
		}
		return nodeName(a) < nodeName(b)
	})
	var out []nodeJSON
	for _, vn := range nodes {
		n := vn.Node
		j := nodeJSON{
			Mesh: n.GetMesh(), Name: n.GetName(), Rid: n.GetNodeRid(), State: nodeState(n.GetStatus()),
			NodeGeneration: n.GetNodeGeneration(), LeaseID: n.GetLeaseId(), Address: n.GetAddress(),
			Capacity: n.GetCapacity(), LoadByKind: map[string]int{},
		}
		for k, count := range load[location.NodeKeyOf(n)] {
			j.Load += count
			j.LoadByKind[location.KindName(k)] = count
		}
		out = append(out, j)
	}
	return out, dir, ended, nil
}

// recordJSON is one record of `where --json` and `ls --json`.
type recordJSON struct {
	Kind                     string `json:"kind"`
	ID                       string `json:"id"`
	State                    string `json:"state"`
	Owner                    string `json:"owner,omitempty"` // the owner's name, else its RID; "" when ended
	OwnerRid                 string `json:"owner_rid"`
	OwnerMesh                string `json:"owner_mesh"`
	OwnerNodeGeneration      uint64 `json:"owner_node_generation"`
	OwnerLive                bool   `json:"owner_live"`
	ObjectGeneration         uint64 `json:"object_generation"`
	AuthorityOwnerGeneration uint64 `json:"authority_owner_generation"`
	StableType               string `json:"stable_type"`
}

func recordOf(v location.Versioned, dir *directory) recordJSON {
	r, o := v.Record, v.Record.GetOwner()
	j := recordJSON{
		Kind: location.KindName(v.Key.Kind), ID: v.Key.ID, State: stateName(r.GetState()),
		OwnerRid: o.GetNodeRid(), OwnerMesh: o.GetMesh(), OwnerNodeGeneration: o.GetNodeGeneration(),
		ObjectGeneration: r.GetObjectGeneration(), AuthorityOwnerGeneration: r.GetAuthorityOwnerGeneration(),
		StableType: r.GetStableType(),
	}
	if dir != nil {
		if n := dir.owner(o); n != nil {
			j.Owner, j.OwnerLive = nodeName(n), true
		}
	}
	return j
}

// Where prints the record of id under each kind and its owner; NotFound
// (exit status 1) when there is none.
func (c *ctl) Where(ctx context.Context, id string) error {
	ctx, cancel := c.readCtx(ctx)
	defer cancel()
	found, err := c.records(ctx, whereKinds, id)
	if err != nil {
		return err
	}
	if len(found) == 0 {
		if c.json {
			_ = writeJSON(c.out, map[string]any{"id": id, "records": []recordJSON{}})
		}
		return failf(exitFailed, "%q: no record under any kind (not found)", id)
	}
	dir, err := c.directory(ctx, "")
	if err != nil {
		return err
	}
	var recs []recordJSON
	for _, v := range found {
		recs = append(recs, recordOf(v, dir))
	}
	if c.json {
		return writeJSON(c.out, map[string]any{"id": id, "records": recs})
	}
	rows := [][]string{{"KIND", "STATE", "OWNER", "OBJ-GEN", "OWNER-GEN", "TYPE"}}
	for _, r := range recs {
		owner := r.Owner
		if !r.OwnerLive {
			owner = "(ended)"
		}
		typ := r.StableType
		if typ == "" {
			typ = "-"
		}
		rows = append(rows, []string{r.Kind, r.State, owner,
			strconv.FormatUint(r.ObjectGeneration, 10), strconv.FormatUint(r.AuthorityOwnerGeneration, 10), typ})
	}
	return table(c.out, rows)
}

// records reads id under each of kinds and returns the ones present.
func (c *ctl) records(ctx context.Context, kinds []location.Kind, id string) ([]location.Versioned, error) {
	var found []location.Versioned
	for _, k := range kinds {
		key := location.Key(k, id)
		if err := key.Validate(); err != nil {
			return nil, failf(exitUsage, "%v", err)
		}
		v, err := c.store.Read(ctx, key)
		switch {
		case notFound(err):
		case err != nil:
			return nil, fmt.Errorf("read %s: %w", key, err)
		default:
			found = append(found, v)
		}
	}
	return found, nil
}

// Ls prints the objects a node owns, by kind and ID. node is a live node's
// name or RID, or the RID of an ended lifecycle whose records remain.
func (c *ctl) Ls(ctx context.Context, node string) error {
	ctx, cancel := c.readCtx(ctx)
	defer cancel()
	dir, err := c.directory(ctx, c.mesh)
	if err != nil {
		return err
	}
	// A live node by name, RID or address; else the RID of an ended
	// lifecycle whose records remain.
	n, findErr := dir.find(node)
	var owned []location.Versioned
	err = c.scan(ctx, location.Kinds, func(v location.Versioned) {
		o := v.Record.GetOwner()
		switch {
		case n != nil:
			if o.GetNodeRid() == n.GetNodeRid() && o.GetMesh() == n.GetMesh() {
				owned = append(owned, v)
			}
		case o.GetNodeRid() == node && (c.mesh == "" || o.GetMesh() == c.mesh):
			owned = append(owned, v)
		}
	})
	if err != nil {
		return err
	}
	if n == nil && len(owned) == 0 {
		return findErr
	}
	sort.Slice(owned, func(i, j int) bool {
		a, b := owned[i].Key, owned[j].Key
		if a.Kind != b.Kind {
			return location.KindName(a.Kind) < location.KindName(b.Kind)
		}
		return a.ID < b.ID
	})
	if c.json {
		objs := []recordJSON{}
		for _, v := range owned {
			objs = append(objs, recordOf(v, dir))
		}
		nodeOut := map[string]any{"rid": node, "live": false}
		if n != nil {
			nodeOut = map[string]any{"mesh": n.GetMesh(), "rid": n.GetNodeRid(), "name": n.GetName(), "live": true}
		}
		return writeJSON(c.out, map[string]any{"node": nodeOut, "objects": objs})
	}
	if n == nil {
		fmt.Fprintf(c.out, "%s: no live node; the records its ended lifecycle still owns:\n", node)
	}
	if len(owned) == 0 {
		fmt.Fprintf(c.out, "%s owns nothing\n", nodeName(n))
		return nil
	}
	rows := [][]string{{"KIND", "ID", "TYPE", "STATE"}}
	for _, v := range owned {
		typ := v.Record.GetStableType()
		if typ == "" {
			typ = "-"
		}
		rows = append(rows, []string{location.KindName(v.Key.Kind), v.Key.ID, typ, stateName(v.Record.GetState())})
	}
	return table(c.out, rows)
}

// Ended prints the objects whose owner is no live node: a crashed, cut off
// or stopped node's objects that live nodes have not recovered yet (they
// do within a few lease TTLs by their kinds' policies), and those that
// wait for an operator's ReleaseEnded (kinds with RecoverByOperator, or
// with state and no checkpoints). docs/FAULTS.md says which is which.
func (c *ctl) Ended(ctx context.Context) error {
	ctx, cancel := c.readCtx(ctx)
	defer cancel()
	nodes, _, ended, err := c.nodeLoads(ctx)
	if err != nil {
		return err
	}
	if len(nodes) == 0 && len(ended) == 0 {
		// Nothing at all: more likely the wrong -prefix or -mesh than a
		// store whose every object is served.
		return c.noLiveNodes(ctx)
	}
	if c.json {
		return writeJSON(c.out, map[string]any{"objects": ended})
	}
	if len(ended) == 0 {
		fmt.Fprintln(c.out, "no object of an ended owner: every object is served")
		return nil
	}
	rows := [][]string{{"KIND", "ID", "TYPE", "STATE", "ENDED OWNER"}}
	for _, r := range ended {
		typ := r.StableType
		if typ == "" {
			typ = "-"
		}
		rows = append(rows, []string{r.Kind, r.ID, typ, r.State, r.OwnerRid})
	}
	if err := table(c.out, rows); err != nil {
		return err
	}
	fmt.Fprintln(c.out, "Live nodes recover these by their kinds' policies; those of kinds that wait for an operator stay until ReleaseEnded accepts their loss.")
	return nil
}
