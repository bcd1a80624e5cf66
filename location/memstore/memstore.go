// Package memstore is the embedded Location Store: in one process,
// linearizable (one mutex orders every operation), with owner leases on an
// injectable clock. It obeys the same contract as consulstore and passes the
// same suite (location/storetest).
//
// Leases end lazily: an expired lease is noticed, and what it holds deleted,
// by the next operation on the store, as if a Consul session's TTL ran out.
package memstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	"github.com/google/btree"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/location"
)

// Clock tells the time; tests inject a ManualClock.
type Clock interface{ Now() time.Time }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// ManualClock is a Clock that moves only when told to.
type ManualClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewManualClock starts at a fixed instant.
func NewManualClock() *ManualClock {
	return &ManualClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

// Now returns the clock's time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// Option configures a Store.
type Option func(*Store)

// WithClock sets the clock leases are measured on (default: the system clock).
func WithClock(c Clock) Option { return func(s *Store) { s.clock = c } }

type recordEntry struct {
	rec     *location.Record
	version location.StoreVersion
	lease   location.LeaseID // held by a lease (Entry claims), "" otherwise
}

type nodeEntry struct {
	node    *location.NodeDescriptor
	version location.StoreVersion
}

// slotEntry is a held capacity slot, under the lease that wrote it.
type slotEntry struct {
	holder  location.AuthorityKey
	pending bool
	lease   location.LeaseID
}

type lease struct {
	ttl     time.Duration
	expires time.Time
	records []location.AuthorityKey
	nodes   []location.NodeKey
}

// Store is the embedded Location Store. The zero value is not usable; call New.
type Store struct {
	clock Clock

	// mu is taken for reading by the reads that need no lease ended
	// (rlock): a node resolving Spots reads here on every route-cache
	// miss, and with one exclusive lock a saturated process's calls
	// queued on it.
	mu      sync.RWMutex
	index   location.StoreVersion
	records map[location.AuthorityKey]*recordEntry
	// ids are the records' IDs by kind, ordered: a List page costs
	// O(log n + page), however many records there are (putLocked and
	// dropLocked keep them with records).
	ids     map[location.Kind]*btree.BTreeG[string]
	nodes   map[location.NodeKey]*nodeEntry
	revoked map[location.NodeKey]bool // lifecycles whose lease RevokeLease ended
	leases  map[location.LeaseID]*lease
	changed chan struct{} // closed and replaced on every change, for WatchNote
	// watched: a channel per record key being watched, closed and
	// removed when that record changes (putLocked, dropLocked) or the
	// store closes. A write wakes only its own key's watchers: with the
	// one channel of every change, each of a drain's writes woke the
	// watches of every move in flight, each taking the lock and cloning
	// its record to find nothing new.
	watched map[location.AuthorityKey]*keyWatch
	closed  bool
	roots   map[string][]byte // RootStore (roots.go)
	// checkpoints: CheckpointStore (checkpoints.go)
	checkpoints map[location.AuthorityKey]*checkpointEntry
	notes       map[location.NoteKey]*noteEntry // Board (board.go)
	// slots are the nodes' capacity slots by index; a node's slots are
	// all held by the lease that holds its descriptor.
	slots map[location.NodeKey]map[uint32]*slotEntry
}

var _ location.Store = (*Store)(nil)

// New returns an empty store.
func New(opts ...Option) *Store {
	s := &Store{
		clock:       systemClock{},
		records:     make(map[location.AuthorityKey]*recordEntry),
		ids:         make(map[location.Kind]*btree.BTreeG[string]),
		nodes:       make(map[location.NodeKey]*nodeEntry),
		leases:      make(map[location.LeaseID]*lease),
		notes:       make(map[location.NoteKey]*noteEntry),
		roots:       make(map[string][]byte),
		checkpoints: make(map[location.AuthorityKey]*checkpointEntry),
		slots:       make(map[location.NodeKey]map[uint32]*slotEntry),
		changed:     make(chan struct{}),
		watched:     map[location.AuthorityKey]*keyWatch{},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// lock takes the store's mutex and ends expired leases first, so every
// operation sees leases as of now.
func (s *Store) lock(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %w", location.ErrUnavailable, err)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fmt.Errorf("%w: store closed", location.ErrUnavailable)
	}
	now := s.clock.Now()
	for id, l := range s.leases {
		if now.After(l.expires) {
			s.endLeaseLocked(id)
		}
	}
	return nil
}

// rlock takes the store's mutex for reading, unless a lease has expired:
// it must end first (a write), so then the mutex is taken for writing, as
// lock does. unlock releases what was taken.
func (s *Store) rlock(ctx context.Context) (unlock func(), err error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", location.ErrUnavailable, err)
	}
	s.mu.RLock()
	if !s.closed && !s.leaseExpiredLocked() {
		return s.mu.RUnlock, nil
	}
	s.mu.RUnlock()
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	return s.mu.Unlock, nil
}

func (s *Store) leaseExpiredLocked() bool {
	now := s.clock.Now()
	for _, l := range s.leases {
		if now.After(l.expires) {
			return true
		}
	}
	return false
}

func (s *Store) endLeaseLocked(id location.LeaseID) {
	l := s.leases[id]
	if l == nil {
		return
	}
	delete(s.leases, id)
	changed := false
	for _, k := range l.records {
		if e := s.records[k]; e != nil && e.lease == id {
			s.dropLocked(k)
			changed = true
		}
	}
	for _, k := range l.nodes {
		if e := s.nodes[k]; e != nil && location.LeaseID(e.node.GetLeaseId()) == id {
			delete(s.nodes, k)
			changed = true
		}
	}
	if s.dropSlotsLocked(l, id) {
		changed = true
	}
	if changed {
		s.bumpLocked()
	}
}

// dropSlotsLocked deletes the slots lease id holds, as Consul deletes the
// keys a session holds when it ends (behaviour delete). A lease writes
// slots only of the node it holds, so those of l.nodes are all there are.
func (s *Store) dropSlotsLocked(l *lease, id location.LeaseID) bool {
	dropped := false
	for _, k := range l.nodes {
		for i, e := range s.slots[k] {
			if e.lease == id {
				delete(s.slots[k], i)
				dropped = true
			}
		}
		if len(s.slots[k]) == 0 {
			delete(s.slots, k)
		}
	}
	return dropped
}

// bumpLocked advances the store index and wakes watchers.
func (s *Store) bumpLocked() location.StoreVersion {
	s.index++
	close(s.changed)
	s.changed = make(chan struct{})
	return s.index
}

func (s *Store) versionedLocked(key location.AuthorityKey) location.Versioned {
	e := s.records[key]
	if e == nil {
		return location.Versioned{Key: key}
	}
	return location.Versioned{Key: key, Record: proto.Clone(e.rec).(*location.Record), Version: e.version}
}

// Read implements location.Store.
func (s *Store) Read(ctx context.Context, key location.AuthorityKey) (location.Versioned, error) {
	if err := key.Validate(); err != nil {
		return location.Versioned{}, err
	}
	unlock, err := s.rlock(ctx)
	if err != nil {
		return location.Versioned{}, err
	}
	defer unlock()
	v := s.versionedLocked(key)
	if !v.Present() {
		return v, &location.KeyNotFound{Key: key}
	}
	return v, nil
}

// ReadKeys implements location.KeysReader: the keys under one lock.
func (s *Store) ReadKeys(ctx context.Context, keys ...location.AuthorityKey) ([]location.Versioned, error) {
	if err := location.ValidateReadKeys(keys); err != nil {
		return nil, err
	}
	unlock, err := s.rlock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	out := make([]location.Versioned, len(keys))
	for i, k := range keys {
		out[i] = s.versionedLocked(k)
	}
	return out, nil
}

// List implements location.Store. The cursor is the last ID returned; IDs
// are ordered byte-wise.
func (s *Store) List(ctx context.Context, kind location.Kind, page location.PageRequest) (location.Page, error) {
	if err := (location.AuthorityKey{Kind: kind, ID: "x"}).Validate(); err != nil {
		return location.Page{}, err
	}
	if err := page.Validate(); err != nil {
		return location.Page{}, err
	}
	unlock, err := s.rlock(ctx)
	if err != nil {
		return location.Page{}, err
	}
	defer unlock()
	// The page.Size IDs after page.After, and one more if there is one.
	var ids []string
	if t := s.ids[kind]; t != nil {
		t.AscendGreaterOrEqual(page.After, func(id string) bool {
			if id == page.After {
				return true
			}
			ids = append(ids, id)
			return len(ids) <= page.Size
		})
	}
	var out location.Page
	bytes := 0
	for i, id := range ids {
		v := s.versionedLocked(location.Key(kind, id))
		n := location.PageBytes(v.Record) // ≥ its EncodedSize, at a tenth of the cost
		if len(out.Items) == page.Size || bytes+n > location.MaxPageBytes {
			out.Next = ids[i-1]
			break
		}
		bytes += n
		out.Items = append(out.Items, v)
	}
	return out, nil
}

// CompareAndSet implements location.Store.
func (s *Store) CompareAndSet(ctx context.Context, key location.AuthorityKey, expected location.StoreVersion, rec *location.Record) (location.StoreVersion, error) {
	return location.CompareAndSetByApply(ctx, s.Apply, key, expected, rec)
}

// Apply implements location.Store.
func (s *Store) Apply(ctx context.Context, ops []location.Op) ([]location.StoreVersion, error) {
	if err := location.ValidateOps(ops); err != nil {
		return nil, err
	}
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	var failed []int
	for i, op := range ops {
		switch op.Kind {
		case location.OpCheckLease, location.OpTakeSlot, location.OpSetSlot:
			if !s.leaseHoldsLocked(op.Node, op.Lease) {
				return nil, fmt.Errorf("%w: lease %s does not hold %s (op %d)", location.ErrLeaseEnded, op.Lease, op.Node, i)
			}
		}
		switch op.Kind {
		case location.OpCheckLease, location.OpSetSlot, location.OpFreeSlot:
			continue
		case location.OpTakeSlot:
			if s.slots[op.Node][op.Slot] != nil {
				failed = append(failed, i)
			}
			continue
		case location.OpCreateRoot:
			if _, ok := s.roots[op.RootKey]; ok {
				failed = append(failed, i)
			}
			continue
		case location.OpCheckNoCheckpoint:
			if _, ok := s.checkpoints[op.Key]; ok {
				failed = append(failed, i)
			}
			continue
		case location.OpDeleteRoot:
			continue
		}
		cur := location.StoreVersion(0)
		if e := s.records[op.Key]; e != nil {
			cur = e.version
		}
		want := op.Version // create: 0
		if cur != want {
			failed = append(failed, i)
		}
	}
	if len(failed) > 0 {
		c := &location.ConflictError{Op: "apply", FailedOps: failed}
		for _, op := range ops {
			if op.Kind.OnRecord() {
				c.Current = append(c.Current, s.versionedLocked(op.Key))
			}
		}
		return nil, c
	}
	out := make([]location.StoreVersion, len(ops))
	if !hasWrite(ops) {
		for i, op := range ops {
			out[i] = op.Version
		}
		return out, nil
	}
	v := s.bumpLocked()
	for i, op := range ops {
		switch op.Kind {
		case location.OpCreate, location.OpUpdate:
			s.putLocked(op.Key, &recordEntry{rec: proto.Clone(op.Record).(*location.Record), version: v})
			out[i] = v
		case location.OpDelete:
			s.dropLocked(op.Key)
		case location.OpCheck:
			out[i] = op.Version
		case location.OpTakeSlot, location.OpSetSlot:
			m := s.slots[op.Node]
			if m == nil {
				m = map[uint32]*slotEntry{}
				s.slots[op.Node] = m
			}
			m[op.Slot] = &slotEntry{holder: op.Key, pending: op.Pending, lease: op.Lease}
		case location.OpFreeSlot:
			delete(s.slots[op.Node], op.Slot)
			if len(s.slots[op.Node]) == 0 {
				delete(s.slots, op.Node)
			}
		case location.OpCreateRoot:
			s.roots[op.RootKey] = bytes.Clone(op.Data)
		case location.OpDeleteRoot:
			delete(s.roots, op.RootKey)
		}
	}
	return out, nil
}

// leaseHoldsLocked reports whether the live lease holds node's descriptor.
func (s *Store) leaseHoldsLocked(node location.NodeKey, id location.LeaseID) bool {
	e := s.nodes[node]
	return s.leases[id] != nil && e != nil && location.LeaseID(e.node.GetLeaseId()) == id
}

func hasWrite(ops []location.Op) bool {
	for _, op := range ops {
		if op.Kind != location.OpCheck && op.Kind != location.OpCheckLease && op.Kind != location.OpCheckNoCheckpoint {
			return true
		}
	}
	return false
}

// Watch implements location.Store.
func (s *Store) Watch(ctx context.Context, key location.AuthorityKey, after location.StoreVersion) (location.Versioned, error) {
	if err := key.Validate(); err != nil {
		return location.Versioned{}, err
	}
	for {
		if err := s.lock(ctx); err != nil {
			return location.Versioned{}, err
		}
		cur := location.StoreVersion(0)
		if e := s.records[key]; e != nil {
			cur = e.version
		}
		if cur != after {
			v := s.versionedLocked(key)
			s.mu.Unlock()
			return v, nil
		}
		w := s.watched[key]
		if w == nil {
			w = &keyWatch{ch: make(chan struct{})}
			s.watched[key] = w
		}
		w.n++
		s.mu.Unlock()
		select {
		case <-w.ch:
		case <-ctx.Done():
			// The last watcher to leave takes the channel with it: keys
			// watched and never written do not pile up.
			s.mu.Lock()
			if w.n--; w.n == 0 && s.watched[key] == w {
				delete(s.watched, key)
			}
			s.mu.Unlock()
			return location.Versioned{}, fmt.Errorf("%w: watch %s: %w", location.ErrUnavailable, key, ctx.Err())
		}
	}
}

// ClaimNode implements location.Store.
func (s *Store) ClaimNode(ctx context.Context, node *location.NodeDescriptor, ttl time.Duration) (location.Lease, error) {
	if err := location.ValidateNode(node); err != nil {
		return location.Lease{}, err
	}
	if err := location.ValidateTTL(ttl); err != nil {
		return location.Lease{}, err
	}
	if err := s.lock(ctx); err != nil {
		return location.Lease{}, err
	}
	defer s.mu.Unlock()
	nk := location.NodeKeyOf(node)
	ek := location.Key(location.KindEntry, node.GetEntrySpotId())
	if s.nodes[nk] != nil || s.records[ek] != nil {
		c := &location.ConflictError{Op: "claim node", Current: []location.Versioned{s.versionedLocked(ek)}}
		if s.nodes[nk] != nil {
			c.FailedOps = append(c.FailedOps, 0)
		}
		if s.records[ek] != nil {
			c.FailedOps = append(c.FailedOps, 1)
		}
		return location.Lease{}, c
	}
	if name := node.GetName(); name != "" {
		for k, e := range s.nodes {
			if k.Mesh == nk.Mesh && e.node.GetName() == name {
				return location.Lease{}, fmt.Errorf("%w: %q: %w", location.ErrNodeNameTaken, name,
					&location.ConflictError{Op: "claim node", FailedOps: []int{2}})
			}
		}
	}
	id := newLeaseID()
	stored := proto.Clone(node).(*location.NodeDescriptor)
	stored.LeaseId = string(id)
	v := s.bumpLocked()
	s.nodes[nk] = &nodeEntry{node: stored, version: v}
	s.putLocked(ek, &recordEntry{rec: location.EntryClaim(stored, id), version: v, lease: id})
	s.leases[id] = &lease{ttl: ttl, expires: s.clock.Now().Add(ttl), records: []location.AuthorityKey{ek}, nodes: []location.NodeKey{nk}}
	return location.Lease{ID: id, TTL: ttl}, nil
}

// RenewLease implements location.Store.
func (s *Store) RenewLease(ctx context.Context, id location.LeaseID) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	l := s.leases[id]
	if l == nil {
		return fmt.Errorf("%w: lease %s", location.ErrNotFound, id)
	}
	l.expires = s.clock.Now().Add(l.ttl)
	v := s.bumpLocked()
	for _, k := range l.nodes {
		if e := s.nodes[k]; e != nil && location.LeaseID(e.node.GetLeaseId()) == id {
			e.version = v
		}
	}
	return nil
}

// RevokeLease implements location.Store.
func (s *Store) RevokeLease(ctx context.Context, node location.NodeKey, at location.StoreVersion) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	e := s.nodes[node]
	switch {
	case e == nil:
		return fmt.Errorf("%w: node %s", location.ErrNotFound, node)
	case e.version != at:
		return &location.ConflictError{Op: "revoke lease", FailedOps: []int{0}}
	}
	s.endLeaseLocked(location.LeaseID(e.node.GetLeaseId()))
	if s.revoked == nil {
		s.revoked = map[location.NodeKey]bool{}
	}
	s.revoked[node] = true
	return nil
}

// ReleaseNode implements location.Store.
func (s *Store) ReleaseNode(ctx context.Context, node *location.NodeDescriptor) error {
	if err := location.ValidateNode(node); err != nil {
		return err
	}
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	nk := location.NodeKeyOf(node)
	cur := s.nodes[nk]
	if cur == nil {
		return fmt.Errorf("%w: %s", location.ErrNotFound, nk)
	}
	if cur.node.GetLeaseId() != node.GetLeaseId() || cur.node.GetNodeGeneration() != node.GetNodeGeneration() {
		return &location.ConflictError{Op: "release node (stale lifecycle)", FailedOps: []int{0}}
	}
	ek := location.Key(location.KindEntry, cur.node.GetEntrySpotId())
	delete(s.nodes, nk)
	if e := s.records[ek]; e != nil && e.lease == location.LeaseID(node.GetLeaseId()) {
		s.dropLocked(ek)
	}
	if l := s.leases[location.LeaseID(node.GetLeaseId())]; l != nil {
		s.dropSlotsLocked(l, location.LeaseID(node.GetLeaseId()))
	}
	delete(s.leases, location.LeaseID(node.GetLeaseId()))
	s.bumpLocked()
	return nil
}

// UpdateNode implements location.Store.
func (s *Store) UpdateNode(ctx context.Context, node *location.NodeDescriptor, expected location.StoreVersion) (location.StoreVersion, error) {
	if err := location.ValidateNodeUpdateRequest(node); err != nil {
		return 0, err
	}
	if err := s.lock(ctx); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	nk := location.NodeKeyOf(node)
	cur := s.nodes[nk]
	if cur == nil {
		return 0, fmt.Errorf("%w: %s", location.ErrNotFound, nk)
	}
	// The lease names the lifecycle; a changed generation under the same
	// lease is a malformed update (ValidateNodeUpdate), not another one.
	if cur.node.GetLeaseId() != node.GetLeaseId() {
		if s.leases[location.LeaseID(node.GetLeaseId())] == nil {
			return 0, fmt.Errorf("%w: node %s", location.ErrLeaseEnded, nk)
		}
		return 0, &location.ConflictError{Op: "update node (another lifecycle)", FailedOps: []int{0}}
	}
	if err := location.ValidateNodeUpdate(cur.node, node); err != nil {
		return 0, err
	}
	if cur.version != expected {
		return 0, &location.ConflictError{Op: "update node", FailedOps: []int{0}}
	}
	v := s.bumpLocked()
	s.nodes[nk] = &nodeEntry{node: proto.Clone(node).(*location.NodeDescriptor), version: v}
	return v, nil
}

// ReadNode implements location.Store.
func (s *Store) ReadNode(ctx context.Context, key location.NodeKey) (location.VersionedNode, error) {
	if err := key.Validate(); err != nil {
		return location.VersionedNode{}, err
	}
	unlock, err := s.rlock(ctx)
	if err != nil {
		return location.VersionedNode{}, err
	}
	defer unlock()
	e := s.nodes[key]
	switch {
	case e == nil && s.revoked[key]:
		return location.VersionedNode{}, fmt.Errorf("%w: %s", location.ErrLeaseRevoked, key)
	case e == nil:
		return location.VersionedNode{}, fmt.Errorf("%w: %s", location.ErrNotFound, key)
	}
	return location.VersionedNode{Node: proto.Clone(e.node).(*location.NodeDescriptor), Version: e.version}, nil
}

// ListNodes implements location.Store.
func (s *Store) ListNodes(ctx context.Context, mesh string) ([]location.VersionedNode, error) {
	unlock, err := s.rlock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	var out []location.VersionedNode
	for k, e := range s.nodes {
		if mesh == "" || k.Mesh == mesh {
			out = append(out, location.VersionedNode{Node: proto.Clone(e.node).(*location.NodeDescriptor), Version: e.version})
		}
	}
	location.SortNodes(out)
	return out, nil
}

// ListSlots implements location.Store.
func (s *Store) ListSlots(ctx context.Context, node location.NodeKey) ([]location.Slot, error) {
	if err := node.Validate(); err != nil {
		return nil, err
	}
	unlock, err := s.rlock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	out := make([]location.Slot, 0, len(s.slots[node]))
	for i, e := range s.slots[node] {
		out = append(out, location.Slot{Index: i, Holder: e.holder, Pending: e.pending})
	}
	location.SortSlots(out)
	return out, nil
}

// LeaseAlive implements location.Store.
func (s *Store) LeaseAlive(ctx context.Context, id location.LeaseID) (bool, error) {
	if err := s.lock(ctx); err != nil {
		return false, err
	}
	defer s.mu.Unlock()
	return s.leases[id] != nil, nil
}

// Close implements location.Store; later calls fail with ErrUnavailable.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		close(s.changed)
		for k := range s.watched {
			s.wakeLocked(k)
		}
	}
	return nil
}

func newLeaseID() location.LeaseID {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return location.LeaseID(hex.EncodeToString(b[:]))
}

// LeaseExpiry reports when a lease will end if not renewed (for tests and
// diagnostics).
func (s *Store) LeaseExpiry(id location.LeaseID) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.leases[id]
	if l == nil {
		return time.Time{}, false
	}
	return l.expires, true
}

// InProcess implements location.InProcess: every call stays in the process.
func (s *Store) InProcess() bool { return true }

// CheckpointsInApply implements location.CheckpointsInApply.
func (s *Store) CheckpointsInApply() bool { return true }

// Immediate implements location.Immediate: every call but Watch returns
// at once, under the store's mutex at most.
func (s *Store) Immediate() location.Store { return s }

// putLocked sets the record of key.
func (s *Store) putLocked(key location.AuthorityKey, e *recordEntry) {
	if _, ok := s.records[key]; !ok {
		t := s.ids[key.Kind]
		if t == nil {
			t = btree.NewOrderedG[string](32)
			s.ids[key.Kind] = t
		}
		t.ReplaceOrInsert(key.ID)
	}
	s.records[key] = e
	s.wakeLocked(key)
}

// keyWatch is the channel the watchers of one key wait on, and how many
// do.
type keyWatch struct {
	ch chan struct{}
	n  int
}

// wakeLocked wakes the watchers of key.
func (s *Store) wakeLocked(key location.AuthorityKey) {
	if w := s.watched[key]; w != nil {
		close(w.ch)
		delete(s.watched, key)
	}
}

// dropLocked deletes the record of key.
func (s *Store) dropLocked(key location.AuthorityKey) {
	if _, ok := s.records[key]; !ok {
		return
	}
	delete(s.records, key)
	s.ids[key.Kind].Delete(key.ID)
	s.wakeLocked(key)
}
