package relocation

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/roamactors/roam/internal/checkpoint"
	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/ratelog"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// checkpointer runs a node's checkpoints (docs/FAULTS.md, "Checkpoints and
// recovery"): the one clock that captures objects whose captures fall due
// by time, and the Writer that stores the captures. When a capture is due
// is checkpoint.Policy's decision; which capture wins is the Writer's
// (checkpoint.Judge).
type checkpointer struct {
	w     *checkpoint.Writer
	clock machine.Clock
	// tick is the clock's period: the shortest any registered kind needs
	// (nanoseconds; 0 while no kind captures by time).
	tick atomic.Int64

	mu    sync.Mutex
	dirty map[*object]struct{} // objects with uncaptured turns whose policy is timed
	wake  chan struct{}
	stop  chan struct{}
	once  sync.Once

	captureFailed ratelog.Limiter
	captures      atomic.Uint64
}

// cpState is an incarnation's checkpoint bookkeeping (only incarnations of
// kinds that checkpoint have one).
type cpState struct {
	mu    sync.Mutex
	dirty checkpoint.Dirty
	seq   uint64 // the incarnation's last capture's Sequence
	// stored is the version of the stored checkpoint as this incarnation
	// last learned it: its own writes' (Landed), or its move's source's
	// (0: unknown, unless none): the checkpoint Writer starts its writes
	// from it (checkpoint.Tracker). current: the checkpoint there holds
	// exactly the incarnation's state (its capture landed, no turn ran
	// since, no later capture). A move carries both to its target
	// (CheckpointAt).
	stored  location.StoreVersion
	queued  bool // in the clock's dirty set, or a capture is queued
	current bool
	none    bool // stored is 0 because none is stored (Staged.NoCheckpoint)
}

// Known and Landed make cpState the checkpoint.Tracker of its
// incarnation's captures.
func (cs *cpState) Known() (location.StoreVersion, bool) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.stored, cs.stored != 0 || cs.none
}

func (cs *cpState) Landed(v location.StoreVersion, f checkpoint.Fence) {
	// Writes of one object land in capture order.
	cs.mu.Lock()
	cs.stored = v
	cs.current = f.Sequence == cs.seq && cs.dirty.Turns == 0
	cs.mu.Unlock()
}

func newCheckpointer(store location.CheckpointStore, lease func() error, d *Driver) *checkpointer {
	c := &checkpointer{
		clock: d.clock,
		w:     checkpoint.NewWriter(checkpoint.Config{Store: store, Lease: lease, Log: d.log, Clock: d.clock}),
		dirty: map[*object]struct{}{},
		wake:  make(chan struct{}, 1),
		stop:  make(chan struct{}),
	}
	c.captureFailed.Every = time.Second
	return c
}

// register adds a kind's policy to the clock's period.
func (c *checkpointer) register(p checkpoint.Policy) {
	if !p.Timed() {
		return
	}
	for {
		cur := c.tick.Load()
		if cur != 0 && cur <= int64(p.Tick()) {
			return
		}
		if c.tick.CompareAndSwap(cur, int64(p.Tick())) {
			break
		}
	}
	c.once.Do(func() { go c.run() })
}

// run is the clock: every tick, the objects whose captures fell due are
// asked to capture between their turns.
func (c *checkpointer) run() {
	fire, t := machine.NewTimer(c.clock, time.Duration(c.tick.Load()))
	defer func() { t.Stop() }()
	for {
		select {
		case <-c.stop:
			return
		case <-fire:
		}
		now := c.clock.Now()
		var due []*object
		c.mu.Lock()
		for o := range c.dirty {
			cs := o.cp
			cs.mu.Lock()
			switch {
			case cs.dirty.Turns == 0: // captured on a turn (Every) meanwhile
				cs.queued = false
				delete(c.dirty, o)
			case o.kind.checkpoints.Due(cs.dirty, now):
				delete(c.dirty, o)
				due = append(due, o)
			}
			cs.mu.Unlock()
		}
		c.mu.Unlock()
		for _, o := range due {
			if err := o.mb.Do(func() { o.captureQueued() }); err != nil {
				// The mailbox ended: so did the incarnation.
				o.cp.mu.Lock()
				o.cp.queued = false
				o.cp.mu.Unlock()
			}
		}
		fire, t = machine.NewTimer(c.clock, time.Duration(c.tick.Load()))
	}
}

// shutdown stops the clock and the writer (what waits is dropped: the
// lifecycle ended, and a recovery claims what is stored).
func (c *checkpointer) shutdown() {
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	c.w.Stop()
}

// turnEnded counts a handled message of o (on its goroutine) and captures
// at once when its policy says so, or hands it to the clock.
func (o *object) turnEnded() {
	cs := o.cp
	if cs == nil {
		return
	}
	p := o.kind.checkpoints
	cs.mu.Lock()
	cs.current = false
	now := o.d.clock.Now()
	captureNow := p.AfterTurn(&cs.dirty, now)
	enqueue := !captureNow && p.Timed() && !cs.queued
	if enqueue {
		cs.queued = true
	}
	cs.mu.Unlock()
	switch {
	case captureNow:
		o.capture()
	case enqueue:
		cps := o.d.cps
		cps.mu.Lock()
		cps.dirty[o] = struct{}{}
		cps.mu.Unlock()
	}
}

// markDirty makes an arriving incarnation's state (carried by a move, not
// in any checkpoint yet) due for a capture by its policy.
func (o *object) markDirty() {
	if o.cp == nil {
		return
	}
	o.turnEnded()
}

// checkpointsOnArrival starts the checkpoints of an incarnation that a
// move brought here, once it serves, from what its source knew of its
// stored checkpoint (at; nil: nothing). A state the stored checkpoint
// holds already is not written again: the source's capture landed and no
// turn ran since, so a recovery from that checkpoint restores exactly what
// arrived. Any other state is in no checkpoint yet and is due for a
// capture by the kind's policy; its write compares against the version
// the source knew, with no read.
func (o *object) checkpointsOnArrival(at *messages.CheckpointAt) {
	cs := o.cp
	if cs == nil {
		return
	}
	if v := location.StoreVersion(at.GetVersion()); v != 0 {
		cs.mu.Lock()
		// Not over what a capture of its own (a turn of the backlog may
		// have run) learned already.
		fresh := cs.seq == 0
		if fresh {
			cs.stored = v
			cs.current = at.GetCurrent() && cs.dirty.Turns == 0
		}
		current := cs.current
		cs.mu.Unlock()
		if current {
			return
		}
	}
	_ = o.mb.Do(o.markDirty)
}

// checkpointAt is what the incarnation knows of its stored checkpoint, for
// its move's target (nil: nothing). On its goroutine, sealed.
func (o *object) checkpointAt() *messages.CheckpointAt {
	cs := o.cp
	if cs == nil {
		return nil
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.stored == 0 {
		return nil
	}
	return &messages.CheckpointAt{Version: uint64(cs.stored), Current: cs.current && cs.dirty.Turns == 0}
}

// captureQueued is the clock's capture, on o's goroutine.
func (o *object) captureQueued() {
	o.cp.mu.Lock()
	o.cp.queued = false
	o.cp.mu.Unlock()
	o.capture()
}

// captureHeldBack captures, between turns, what a per-turn policy (Every)
// could not capture while the cold activation's recovery pointer was in
// the store (capture): otherwise the first message's state waits for a
// next message that may never come, and a crash meanwhile loses it.
// A timed policy needs nothing: capture put the object back on the clock.
func (o *object) captureHeldBack() {
	cs := o.cp
	if cs == nil || o.mb == nil || o.kind.checkpoints.Every == 0 {
		return
	}
	due := func() bool {
		cs.mu.Lock()
		defer cs.mu.Unlock()
		return cs.dirty.Turns >= o.kind.checkpoints.Every
	}
	if !due() {
		return
	}
	// An error: the mailbox closed, and the incarnation with it.
	_ = o.mb.Do(func() {
		if due() { // not captured by a turn meanwhile
			o.capture()
		}
	})
}

// capture takes o's state, between turns on its goroutine, and hands it to
// the writer. Not while a cold activation's recovery pointer may still be
// in the store: a resume would replay the first message over a checkpoint
// that already holds it (the object stays due, and the clock comes back).
// An incarnation that moved away has no state left to capture.
func (o *object) capture() {
	cs := o.cp
	if o.inst == nil || o.flags.load(flagActivating) {
		if o.inst != nil && o.kind.checkpoints.Timed() {
			cs.mu.Lock()
			requeue := !cs.queued
			cs.queued = true
			cs.mu.Unlock()
			if requeue {
				cps := o.d.cps
				cps.mu.Lock()
				cps.dirty[o] = struct{}{}
				cps.mu.Unlock()
			}
		}
		return
	}
	p, _ := o.kind.Policy.(preserveStateWith)
	state, err := o.captureState(p)
	cs.mu.Lock()
	cs.dirty = checkpoint.Dirty{}
	cs.seq++
	cs.current = false
	seq := cs.seq
	cs.mu.Unlock()
	cps := o.d.cps
	if err != nil {
		if ev := cps.captureFailed.Warn(&o.d.log); ev != nil {
			ev.Str("event", "checkpoint_capture_failed").Str("object_id", o.key.ID).Str("stable_type", o.kind.StableType).Err(err).
				Msg("the state adapter's capture failed; the last checkpoint stays, and the next handled message captures again")
		}
		return
	}
	cps.captures.Add(1)
	cps.w.SubmitTracked(o.key, checkpoint.Checkpoint{
		Fence:      checkpoint.Fence{ObjectGeneration: o.generation, OwnerGeneration: o.ownerGeneration, Sequence: seq},
		StableType: o.kind.StableType, ApplicationVersion: o.kind.ApplicationVersion,
		TakenUnixNanos: o.d.clock.Now().UnixNano(), State: state,
	}, cs)
}

// ClaimCheckpoint takes key's checkpoint over for a new incarnation with
// generation and ownerGeneration (docs/FAULTS.md): no earlier
// incarnation's capture can replace it afterwards. It returns the state to
// restore; restore is false when there is none (the object starts from its
// producer).
func (d *Driver) ClaimCheckpoint(ctx context.Context, key location.AuthorityKey, stableType string, generation, ownerGeneration uint64) (state []byte, restore bool, err error) {
	k, ok := d.kind(stableType)
	if !ok || !k.Checkpointed() {
		return nil, false, nil
	}
	c, err := d.cps.w.Claim(ctx, key, checkpoint.Fence{ObjectGeneration: generation, OwnerGeneration: ownerGeneration}, stableType, k.ApplicationVersion)
	if err != nil {
		return nil, false, err
	}
	if c.NoState {
		return nil, false, nil
	}
	d.log.Info().Str("event", "checkpoint_restored").Str("object_id", key.ID).Str("stable_type", stableType).
		Uint64("object_generation", generation).Uint64("checkpoint_object_generation", c.Fence.ObjectGeneration).
		Int64("checkpoint_taken_unix_ms", c.TakenUnixNanos/1e6).Int("bytes", len(c.State)).
		Msg("an incarnation starts from its object's last checkpoint")
	return c.State, true, nil
}

// Restore gives the staged incarnation the state a checkpoint held, on the
// actor's goroutine, before it opens.
func (s *Staged) Restore(ctx context.Context, state []byte) error {
	p, ok := s.obj.kind.Policy.(preserveStateWith)
	if !ok {
		return nil
	}
	return s.Do(ctx, func(actor.Actor) error { return s.obj.restoreState(p, state) })
}

// NoCheckpoint tells the node that no checkpoint of the staged object is
// stored (its reservation proved it, location.OpCheckNoCheckpoint): its
// first capture creates one without reading first.
func (s *Staged) NoCheckpoint() {
	if cs := s.obj.cp; s.obj.d.cps != nil && cs != nil {
		cs.mu.Lock()
		cs.none = cs.stored == 0
		cs.mu.Unlock()
	}
}

// restoreAsync queues the restore of state on the staged actor's goroutine
// and returns where its outcome comes; an error when the queue is gone.
func (s *Staged) restoreAsync(state []byte) (<-chan error, error) {
	done := make(chan error, 1)
	p, ok := s.obj.kind.Policy.(preserveStateWith)
	if !ok {
		done <- nil
		return done, nil
	}
	if err := s.obj.mb.Do(func() { done <- s.obj.restoreState(p, state) }); err != nil {
		return nil, fmt.Errorf("%w: %w", roamerr.ErrUnavailable, err)
	}
	return done, nil
}

// forgetCheckpoint replaces a closed object's checkpoint with a tombstone
// (checkpoint.Writer.Forget), a few times if the store fails; a checkpoint
// that stays would be restored by a later activation of the same ID
// (logged, error).
func (d *Driver) forgetCheckpoint(key location.AuthorityKey, gen, owner uint64, stableType string) {
	if d.cps == nil {
		return
	}
	var err error
	for try := 0; try < 3; try++ {
		ctx, cancel := machine.WithTimeout(context.Background(), d.clock, 5*time.Second)
		err = d.cps.w.Forget(ctx, key, gen, owner, stableType)
		cancel()
		if err == nil {
			return
		}
	}
	d.log.Error().Str("event", "checkpoint_delete_failed").Str("object_id", key.ID).Err(err).
		Msg("a closed object's checkpoint could not be deleted; a later activation of the same ID would start from it")
}

// CheckpointStats are the node's checkpoint counts (tests, metrics).
func (d *Driver) CheckpointStats() (captures uint64, st checkpoint.Stats) {
	if d.cps == nil {
		return 0, checkpoint.Stats{}
	}
	return d.cps.captures.Load(), d.cps.w.Stats()
}

// FlushCheckpoints captures every object this node serves that handled
// messages since its last capture, and waits, within ctx, until the
// writer stored them: a node that stops without moving its objects away
// leaves their latest state to whoever recovers them.
func (d *Driver) FlushCheckpoints(ctx context.Context) error {
	if d.cps == nil || !d.node.Valid() {
		return nil // a node that may not write has nothing to flush
	}
	objs, err := call(ctx, d, func() ([]*object, error) {
		var out []*object
		for _, o := range d.objects {
			if o.cp != nil && o.state == serving && o.r().out == nil {
				out = append(out, o)
			}
		}
		return out, nil
	})
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	for _, o := range objs {
		o.cp.mu.Lock()
		dirty := o.cp.dirty.Turns > 0
		o.cp.mu.Unlock()
		if !dirty {
			continue
		}
		wg.Add(1)
		if o.mb.Do(func() { defer wg.Done(); o.capture() }) != nil {
			wg.Done()
		}
	}
	captured := make(chan struct{})
	go func() { wg.Wait(); close(captured) }()
	select {
	case <-captured:
	case <-ctx.Done():
		return fmt.Errorf("%w: capturing the objects' last state: %w", roamerr.ErrDeadlineExceeded, ctx.Err())
	}
	if err := d.cps.w.WaitIdle(ctx); err != nil {
		return fmt.Errorf("writing the objects' last checkpoints: %w", err)
	}
	return nil
}

// ForgetCheckpoint ends the checkpoints of an ended owner's object whose
// loss an operator accepted (ReleaseEnded): a tombstone above every
// capture of the incarnation rec names, so a new object of the same ID
// starts empty, as the release promises. Call it before the record goes.
func (d *Driver) ForgetCheckpoint(ctx context.Context, key location.AuthorityKey, rec *location.Record) error {
	if d.cps == nil {
		return nil
	}
	if err := d.cps.w.Forget(ctx, key, rec.GetObjectGeneration(), rec.GetAuthorityOwnerGeneration(), rec.GetStableType()); err != nil {
		return roamerr.Keep(roamerr.ErrUnavailable, "forget the checkpoint of "+key.String(), err)
	}
	return nil
}
