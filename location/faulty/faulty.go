// Package faulty wraps a Location Store and injects the failures the
// hand-off must survive (docs/PROTOCOL.md §3.3, §6): latency, unavailable answers, and
// indeterminate write outcomes with the write applied or not. Faults are
// drawn from a seeded generator, so a failing run repeats with its seed, or
// scripted one by one with Inject.
package faulty

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/roamactors/roam/location"
)

// Fault is what happens to one call.
type Fault int

const (
	// None passes the call through.
	None Fault = iota
	// Unavailable fails the call without applying it.
	Unavailable
	// IndeterminateApplied applies a write, then reports its outcome unknown.
	IndeterminateApplied
	// IndeterminateLost drops a write, then reports its outcome unknown.
	IndeterminateLost
)

func (f Fault) String() string {
	switch f {
	case None:
		return "none"
	case Unavailable:
		return "unavailable"
	case IndeterminateApplied:
		return "indeterminate-applied"
	case IndeterminateLost:
		return "indeterminate-lost"
	}
	return fmt.Sprintf("fault%d", int(f))
}

// Config sets the random faults. Probabilities are per call; a read can
// only be Unavailable. The zero Config injects nothing.
type Config struct {
	Seed uint64
	// MaxLatency adds a uniform delay in [0, MaxLatency) before each call.
	MaxLatency time.Duration
	// Unavailable is the probability that a call fails unapplied.
	Unavailable float64
	// IndeterminateApplied is the probability that a write is applied and
	// reported indeterminate.
	IndeterminateApplied float64
	// IndeterminateLost is the probability that a write is dropped and
	// reported indeterminate.
	IndeterminateLost float64
}

// Stats counts the faults injected so far.
type Stats struct {
	Calls int
	// ByOp counts the calls by operation, named as InjectOn names them
	// ("apply", "get checkpoint", …).
	ByOp                 map[string]int
	Unavailable          int
	IndeterminateApplied int
	IndeterminateLost    int
}

// Store is a fault-injecting location.Store.
type Store struct {
	inner location.Store
	cfg   Config

	mu     sync.Mutex
	rng    *rand.Rand
	script []Fault
	// scriptOn: faults queued for the calls of one operation only
	// (InjectOn), drawn before script.
	scriptOn map[string][]Fault
	stats    Stats
	// healed is non-nil while the store is partitioned away: calls wait
	// until it is closed (then go through, late) or their context ends.
	healed chan struct{}
}

// Partition cuts the store off (on) or heals it (off). While cut, every
// call waits: it fails Unavailable when its context ends, or — a message
// delayed in the network — reaches the store late once the cut heals.
func (s *Store) Partition(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case on && s.healed == nil:
		s.healed = make(chan struct{})
	case !on && s.healed != nil:
		close(s.healed)
		s.healed = nil
	}
}

// cut waits out a partition.
func (s *Store) cut(ctx context.Context, what string) error {
	s.mu.Lock()
	healed := s.healed
	s.mu.Unlock()
	if healed == nil {
		return nil
	}
	select {
	case <-healed:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: partitioned on %s: %w", location.ErrUnavailable, what, ctx.Err())
	}
}

var _ location.Store = (*Store)(nil)

// New wraps inner. It rejects probabilities outside [0, 1] or summing over 1.
func New(inner location.Store, cfg Config) (*Store, error) {
	ps := []float64{cfg.Unavailable, cfg.IndeterminateApplied, cfg.IndeterminateLost}
	sum := 0.0
	for _, p := range ps {
		if p < 0 || p > 1 {
			return nil, fmt.Errorf("%w: fault probability %v outside [0, 1]", location.ErrInvalid, p)
		}
		sum += p
	}
	if sum > 1 || cfg.MaxLatency < 0 {
		return nil, fmt.Errorf("%w: fault probabilities sum to %v (max 1), latency %s", location.ErrInvalid, sum, cfg.MaxLatency)
	}
	return &Store{inner: inner, cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))}, nil
}

// Inject queues faults for the next calls, in order, ahead of the random
// ones. A read given an indeterminate fault is made Unavailable.
func (s *Store) Inject(faults ...Fault) {
	s.mu.Lock()
	s.script = append(s.script, faults...)
	s.mu.Unlock()
}

// InjectOn queues faults for the next calls of one operation only, in
// order: op is the operation's name in the errors this store returns
// ("read", "compare-and-set", "apply", "read node", "list nodes", ...).
// Calls of other operations are not affected.
func (s *Store) InjectOn(op string, faults ...Fault) {
	s.mu.Lock()
	if s.scriptOn == nil {
		s.scriptOn = map[string][]Fault{}
	}
	s.scriptOn[op] = append(s.scriptOn[op], faults...)
	s.mu.Unlock()
}

// Stats returns the counts so far.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.ByOp = maps.Clone(s.stats.ByOp)
	return st
}

// next draws the fault and delay of one call.
func (s *Store) next(write bool, what string) (Fault, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.Calls++
	if s.stats.ByOp == nil {
		s.stats.ByOp = map[string]int{}
	}
	s.stats.ByOp[what]++
	var delay time.Duration
	if s.cfg.MaxLatency > 0 {
		delay = time.Duration(s.rng.Int64N(int64(s.cfg.MaxLatency)))
	}
	f := None
	if on := s.scriptOn[what]; len(on) > 0 {
		f, s.scriptOn[what] = on[0], on[1:]
	} else if len(s.script) > 0 {
		f, s.script = s.script[0], s.script[1:]
	} else {
		switch r := s.rng.Float64(); {
		case r < s.cfg.Unavailable:
			f = Unavailable
		case r < s.cfg.Unavailable+s.cfg.IndeterminateApplied:
			f = IndeterminateApplied
		case r < s.cfg.Unavailable+s.cfg.IndeterminateApplied+s.cfg.IndeterminateLost:
			f = IndeterminateLost
		}
	}
	if !write && f != None {
		f = Unavailable
	}
	switch f {
	case Unavailable:
		s.stats.Unavailable++
	case IndeterminateApplied:
		s.stats.IndeterminateApplied++
	case IndeterminateLost:
		s.stats.IndeterminateLost++
	}
	return f, delay
}

func wait(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", location.ErrUnavailable, ctx.Err())
	}
}

// read runs a read through the fault draw.
func read[T any](s *Store, ctx context.Context, what string, call func() (T, error)) (T, error) {
	var zero T
	if err := s.cut(ctx, what); err != nil {
		return zero, err
	}
	f, d := s.next(false, what)
	if err := wait(ctx, d); err != nil {
		return zero, err
	}
	if f == Unavailable {
		return zero, fmt.Errorf("%w: injected on %s", location.ErrUnavailable, what)
	}
	return call()
}

// write runs a write through the fault draw.
func write[T any](s *Store, ctx context.Context, what string, call func() (T, error)) (T, error) {
	var zero T
	if err := s.cut(ctx, what); err != nil {
		return zero, err
	}
	f, d := s.next(true, what)
	if err := wait(ctx, d); err != nil {
		return zero, err
	}
	switch f {
	case Unavailable:
		return zero, fmt.Errorf("%w: injected on %s", location.ErrUnavailable, what)
	case IndeterminateLost:
		return zero, fmt.Errorf("%w: injected on %s (not applied)", location.ErrIndeterminate, what)
	case IndeterminateApplied:
		if _, err := call(); err != nil {
			return zero, err
		}
		return zero, fmt.Errorf("%w: injected on %s (applied)", location.ErrIndeterminate, what)
	}
	return call()
}

// Read implements location.Store.
func (s *Store) Read(ctx context.Context, key location.AuthorityKey) (location.Versioned, error) {
	return read(s, ctx, "read", func() (location.Versioned, error) { return s.inner.Read(ctx, key) })
}

// List implements location.Store.
func (s *Store) List(ctx context.Context, kind location.Kind, page location.PageRequest) (location.Page, error) {
	return read(s, ctx, "list", func() (location.Page, error) { return s.inner.List(ctx, kind, page) })
}

// CompareAndSet implements location.Store.
func (s *Store) CompareAndSet(ctx context.Context, key location.AuthorityKey, expected location.StoreVersion, rec *location.Record) (location.StoreVersion, error) {
	return write(s, ctx, "compare-and-set", func() (location.StoreVersion, error) {
		return s.inner.CompareAndSet(ctx, key, expected, rec)
	})
}

// Apply implements location.Store.
func (s *Store) Apply(ctx context.Context, ops []location.Op) ([]location.StoreVersion, error) {
	return write(s, ctx, "apply", func() ([]location.StoreVersion, error) { return s.inner.Apply(ctx, ops) })
}

// Watch implements location.Store.
func (s *Store) Watch(ctx context.Context, key location.AuthorityKey, after location.StoreVersion) (location.Versioned, error) {
	return read(s, ctx, "watch", func() (location.Versioned, error) { return s.inner.Watch(ctx, key, after) })
}

// ClaimNode implements location.Store.
func (s *Store) ClaimNode(ctx context.Context, node *location.NodeDescriptor, ttl time.Duration) (location.Lease, error) {
	return write(s, ctx, "claim node", func() (location.Lease, error) { return s.inner.ClaimNode(ctx, node, ttl) })
}

// RenewLease implements location.Store.
func (s *Store) RenewLease(ctx context.Context, id location.LeaseID) error {
	_, err := write(s, ctx, "renew lease", func() (struct{}, error) { return struct{}{}, s.inner.RenewLease(ctx, id) })
	return err
}

// RevokeLease implements location.Store.
func (s *Store) RevokeLease(ctx context.Context, node location.NodeKey, at location.StoreVersion) error {
	_, err := write(s, ctx, "revoke lease", func() (struct{}, error) { return struct{}{}, s.inner.RevokeLease(ctx, node, at) })
	return err
}

// ReleaseNode implements location.Store.
func (s *Store) ReleaseNode(ctx context.Context, node *location.NodeDescriptor) error {
	_, err := write(s, ctx, "release node", func() (struct{}, error) { return struct{}{}, s.inner.ReleaseNode(ctx, node) })
	return err
}

// UpdateNode implements location.Store.
func (s *Store) UpdateNode(ctx context.Context, node *location.NodeDescriptor, expected location.StoreVersion) (location.StoreVersion, error) {
	return write(s, ctx, "update node", func() (location.StoreVersion, error) { return s.inner.UpdateNode(ctx, node, expected) })
}

// ReadNode implements location.Store.
func (s *Store) ReadNode(ctx context.Context, key location.NodeKey) (location.VersionedNode, error) {
	return read(s, ctx, "read node", func() (location.VersionedNode, error) { return s.inner.ReadNode(ctx, key) })
}

// ListNodes implements location.Store.
func (s *Store) ListNodes(ctx context.Context, mesh string) ([]location.VersionedNode, error) {
	return read(s, ctx, "list nodes", func() ([]location.VersionedNode, error) { return s.inner.ListNodes(ctx, mesh) })
}

// ListSlots implements location.Store.
func (s *Store) ListSlots(ctx context.Context, node location.NodeKey) ([]location.Slot, error) {
	return read(s, ctx, "list slots", func() ([]location.Slot, error) { return s.inner.ListSlots(ctx, node) })
}

// LeaseAlive implements location.Store.
func (s *Store) LeaseAlive(ctx context.Context, id location.LeaseID) (bool, error) {
	return read(s, ctx, "lease alive", func() (bool, error) { return s.inner.LeaseAlive(ctx, id) })
}

// Close implements location.Store.
func (s *Store) Close() error { return s.inner.Close() }

// CheckpointsInApply implements location.CheckpointsInApply as the
// wrapped store does.
func (s *Store) CheckpointsInApply() bool {
	c, ok := s.inner.(location.CheckpointsInApply)
	return ok && c.CheckpointsInApply()
}
