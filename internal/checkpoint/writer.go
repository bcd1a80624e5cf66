package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/ratelog"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// Config configures a node's Writer.
type Config struct {
	Store location.CheckpointStore
	// Lease reports why this node may not write now (its owner lease is
	// not provably in force, or ended); nil: it may. A capture that finds
	// the lease not in force is dropped: its incarnation is fenced, and a
	// later capture (or, once the lease ended, a recovery) replaces it.
	Lease func() error
	Log   zerolog.Logger
	// Concurrency bounds the writes in flight (default 8).
	Concurrency int
	// Timeout bounds one store call (default 5 s).
	Timeout time.Duration
	// Clock stamps checkpoints, times tombstones and bounds store calls
	// (Timeout). Default machine.Real.
	Clock machine.Clock
}

// Stats counts a Writer's outcomes.
type Stats struct {
	// Written: captures stored. Superseded: dropped because the store
	// held the same or a later checkpoint (a moved-away or ended
	// incarnation's late capture). Coalesced: replaced by a newer capture
	// of the same object before they were written. Failed: store calls
	// that failed (retried). Fenced: dropped because the lease was not in
	// force.
	Written, Superseded, Coalesced, Failed, Fenced uint64
}

// Writer stores a node's captures off the dispatch path: per object only
// the newest capture waits (a newer one replaces it), one write per
// object at a time, each a compare-and-set judged by Judge against what
// is stored. A failed write is retried with a growing pause while no
// newer capture of the object waits.
type Writer struct {
	cfg Config

	mu      sync.Mutex
	cond    *sync.Cond
	pending map[location.AuthorityKey]Checkpoint
	queue   []location.AuthorityKey
	writing map[location.AuthorityKey]bool
	// versions: the version this node last wrote or read for an object,
	// so a steady owner's write is one compare-and-set, no read.
	versions   map[location.AuthorityKey]location.StoreVersion
	forgetting map[location.AuthorityKey]bool
	running    int
	stopped    bool
	stop       chan struct{}

	written, superseded, coalesced, failed, fenced atomic.Uint64
	failLog                                        ratelog.Limiter
}

// NewWriter returns a Writer; Stop ends it.
func NewWriter(cfg Config) *Writer {
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 8
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Lease == nil {
		cfg.Lease = func() error { return nil }
	}
	w := &Writer{
		cfg: cfg, pending: map[location.AuthorityKey]Checkpoint{}, writing: map[location.AuthorityKey]bool{},
		versions: map[location.AuthorityKey]location.StoreVersion{}, forgetting: map[location.AuthorityKey]bool{},
		stop: make(chan struct{}), failLog: ratelog.Limiter{Every: time.Second},
	}
	w.cond = sync.NewCond(&w.mu)
	return w
}

// Stats returns the counts so far.
func (w *Writer) Stats() Stats {
	return Stats{Written: w.written.Load(), Superseded: w.superseded.Load(), Coalesced: w.coalesced.Load(),
		Failed: w.failed.Load(), Fenced: w.fenced.Load()}
}

// Submit queues c, the newest capture of key. It returns at once.
func (w *Writer) Submit(key location.AuthorityKey, c Checkpoint) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped || w.forgetting[key] {
		return
	}
	if old, ok := w.pending[key]; ok {
		if c.Fence.Less(old.Fence) {
			w.coalesced.Add(1)
			return
		}
		w.pending[key] = c
		w.coalesced.Add(1)
		return
	}
	w.pending[key] = c
	w.queue = append(w.queue, key)
	w.startLocked()
}

// startLocked starts writes while there is room.
func (w *Writer) startLocked() {
	for w.running < w.cfg.Concurrency && len(w.queue) > 0 {
		key := w.queue[0]
		w.queue = w.queue[1:]
		c, ok := w.pending[key]
		if !ok || w.writing[key] {
			continue // written meanwhile, or re-queued once its write ends
		}
		delete(w.pending, key)
		w.writing[key] = true
		w.running++
		go w.run(key, c)
	}
}

func (w *Writer) run(key location.AuthorityKey, c Checkpoint) {
	for attempt := 0; ; attempt++ {
		err := w.write(key, c)
		if err == nil {
			break
		}
		w.failed.Add(1)
		if ev := w.failLog.Warn(&w.cfg.Log); ev != nil {
			ev.Str("event", "checkpoint_write_failed").Str("object_id", key.ID).Str("object_kind", location.KindName(key.Kind)).
				Str("fence", c.Fence.String()).Err(err).Msg("a checkpoint could not be written; retried while no newer capture waits")
		}
		w.mu.Lock()
		_, newer := w.pending[key]
		gone := w.stopped || w.forgetting[key]
		w.mu.Unlock()
		if newer || gone || errors.Is(err, roamerr.ErrInvalidOperation) || errors.Is(err, roamerr.ErrCapacityExceeded) {
			break // a newer capture replaces it; or it can never be written
		}
		select {
		case <-machine.After(machine.Real, min(50*time.Millisecond<<min(attempt, 5), time.Second)): // pacing
		case <-w.stop:
		}
	}
	w.mu.Lock()
	delete(w.writing, key)
	w.running--
	if _, ok := w.pending[key]; ok {
		w.queue = append(w.queue, key)
	}
	w.startLocked()
	w.cond.Broadcast()
	w.mu.Unlock()
}

// write stores c unless the store holds the same or a later checkpoint.
func (w *Writer) write(key location.AuthorityKey, c Checkpoint) error {
	if err := w.cfg.Lease(); err != nil {
		w.fenced.Add(1)
		return nil
	}
	data, err := Encode(c)
	if err != nil {
		return err
	}
	if len(data) > location.MaxCheckpointBytes {
		return fmt.Errorf("%w: the state of %s is %d bytes, over the checkpoint limit %d", roamerr.ErrCapacityExceeded, key, len(c.State), location.MaxCheckpointBytes)
	}
	w.mu.Lock()
	v, known := w.versions[key]
	w.mu.Unlock()
	for try := 0; try < 4; try++ {
		if !known {
			stored, sv, err := w.read(key)
			if err != nil && !IsCorrupt(err) {
				return err
			}
			v = sv
			if Judge(c.Fence, stored, err) == Superseded {
				w.setVersion(key, v)
				w.superseded.Add(1)
				return nil
			}
			if err != nil {
				w.cfg.Log.Warn().Str("event", "checkpoint_corrupt").Str("object_id", key.ID).Err(err).
					Msg("the stored checkpoint is corrupt; the owner's current capture replaces it")
			}
		}
		ctx, cancel := machine.WithTimeout(context.Background(), machine.Or(w.cfg.Clock), w.cfg.Timeout)
		nv, err := w.cfg.Store.PutCheckpoint(ctx, key, v, data)
		cancel()
		var ce *location.ConflictError
		switch {
		case err == nil:
			w.setVersion(key, nv)
			w.written.Add(1)
			return nil
		case errors.As(err, &ce):
			known = false // read, and judge again
		default:
			w.forgetVersion(key)
			return err
		}
	}
	return fmt.Errorf("%w: the checkpoint of %s kept changing under its write", roamerr.ErrConflict, key)
}

// read returns the decoded stored checkpoint (nil: none) and its version.
func (w *Writer) read(key location.AuthorityKey) (*Checkpoint, location.StoreVersion, error) {
	ctx, cancel := machine.WithTimeout(context.Background(), machine.Or(w.cfg.Clock), w.cfg.Timeout)
	defer cancel()
	data, v, err := w.cfg.Store.GetCheckpoint(ctx, key)
	if errors.Is(err, location.ErrNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	c, err := Decode(data)
	if err != nil {
		return nil, v, err
	}
	return &c, v, nil
}

func (w *Writer) setVersion(key location.AuthorityKey, v location.StoreVersion) {
	w.mu.Lock()
	w.versions[key] = v
	w.mu.Unlock()
}

func (w *Writer) forgetVersion(key location.AuthorityKey) {
	w.mu.Lock()
	delete(w.versions, key)
	w.mu.Unlock()
}

// Claim takes key's checkpoint over for a new incarnation with fence (a
// recovery or a resumed activation, which holds the object's record): it
// rewrites the stored checkpoint under fence by compare-and-set at the
// version read, so no write of an earlier incarnation can land after it,
// and returns what it claimed — with NoState when nothing was stored (a
// marker is then created, with the same effect). A checkpoint of another
// stable type is not this object's state: it is replaced by a NoState
// marker and logged (checkpoint_type_mismatch); so is a corrupt one
// (checkpoint_corrupt, error): unreadable bytes must not keep the object
// from serving. One of a newer format (ErrNewerFormat) is left alone and
// the claim fails: a newer node reads it.
func (w *Writer) Claim(ctx context.Context, key location.AuthorityKey, fence Fence, stableType, appVersion string) (Checkpoint, error) {
	w.mu.Lock()
	if c, ok := w.pending[key]; ok && c.Fence.Less(fence) {
		delete(w.pending, key) // an earlier incarnation's capture here
		w.coalesced.Add(1)
	}
	w.mu.Unlock()
	for {
		if err := ctx.Err(); err != nil {
			return Checkpoint{}, fmt.Errorf("%w: claim the checkpoint of %s: %w", roamerr.ErrDeadlineExceeded, key, err)
		}
		rctx, cancel := machine.WithTimeout(ctx, machine.Or(w.cfg.Clock), w.cfg.Timeout)
		data, v, err := w.cfg.Store.GetCheckpoint(rctx, key)
		cancel()
		claimed := Checkpoint{Fence: fence, StableType: stableType, ApplicationVersion: appVersion, NoState: true, TakenUnixNanos: machine.Or(w.cfg.Clock).Now().UnixNano()}
		switch {
		case errors.Is(err, location.ErrNotFound):
			v = 0
		case err != nil:
			return Checkpoint{}, fmt.Errorf("claim the checkpoint of %s: %w", key, err)
		default:
			stored, derr := Decode(data)
			switch {
			case errors.Is(derr, ErrNewerFormat):
				// A newer node's: only a node that reads it may claim it.
				return Checkpoint{}, fmt.Errorf("claim the checkpoint of %s (version %d): %w", key, v, derr)
			case derr != nil:
				// Bytes nobody can read stop no recovery: the object starts
				// without them, said loudly (no claim could ever succeed).
				w.cfg.Log.Error().Str("event", "checkpoint_corrupt").Str("object_id", key.ID).Uint64("version", uint64(v)).
					Int("bytes", len(data)).Err(derr).
					Msg("the stored checkpoint is corrupt; the object starts without its state")
			case stored.Fence == fence:
				// This claim's own, landed after an indeterminate answer:
				// only the one owner that won its record write claims
				// under its fence.
				w.setVersion(key, v)
				return stored, nil
			case stored.Fence.ObjectGeneration == fence.ObjectGeneration && stored.Fence.OwnerGeneration >= fence.OwnerGeneration:
				// An owner as new as this claim's, or newer, holds it: this
				// claim's takeover lost (its record write was, or will be,
				// refused), and must not move that owner's fence back.
				return Checkpoint{}, fmt.Errorf("%w: the checkpoint of %s is held by owner generation %d, this claim is for %d",
					roamerr.ErrStale, key, stored.Fence.OwnerGeneration, fence.OwnerGeneration)
			case stored.StableType != stableType:
				w.cfg.Log.Warn().Str("event", "checkpoint_type_mismatch").Str("object_id", key.ID).
					Str("stored_type", stored.StableType).Str("stable_type", stableType).
					Msg("the stored checkpoint is of another stable type (left by an earlier object of this ID); the object starts without it")
			default:
				claimed = stored
				claimed.Fence = fence
			}
		}
		enc, err := Encode(claimed)
		if err != nil {
			return Checkpoint{}, err
		}
		wctx, cancel := machine.WithTimeout(ctx, machine.Or(w.cfg.Clock), w.cfg.Timeout)
		nv, err := w.cfg.Store.PutCheckpoint(wctx, key, v, enc)
		cancel()
		var ce *location.ConflictError
		switch {
		case err == nil:
			w.setVersion(key, nv)
			return claimed, nil
		case errors.As(err, &ce):
			continue // a late write of the earlier incarnation: claim that
		default:
			// An indeterminate claim is read again: the claim found stored
			// under this fence is this one's.
			w.forgetVersion(key)
			if !errors.Is(err, location.ErrIndeterminate) {
				return Checkpoint{}, fmt.Errorf("claim the checkpoint of %s: %w", key, err)
			}
			rctx, cancel := machine.WithTimeout(ctx, machine.Or(w.cfg.Clock), w.cfg.Timeout)
			data, v2, rerr := w.cfg.Store.GetCheckpoint(rctx, key)
			cancel()
			if rerr == nil {
				if got, derr := Decode(data); derr == nil && got.Fence == fence {
					w.setVersion(key, v2)
					return got, nil
				}
			}
		}
	}
}

// TombstoneFor is how long a closed object's tombstone stays before it is
// deleted: far longer than any write of the closed incarnation can still
// be on its way to the store (each is bounded by the writer's Timeout).
const TombstoneFor = time.Minute

// Tombstone is what a closed incarnation with generations gen and owner
// leaves: a NoState checkpoint above every capture it made, so none of
// them, however late, can bring its state back, and a new object of the
// same ID starts empty.
func Tombstone(gen, owner uint64, stableType string) Checkpoint {
	return Checkpoint{Fence: Fence{ObjectGeneration: gen, OwnerGeneration: owner, Sequence: ^uint64(0)}, StableType: stableType, NoState: true}
}

// Forget ends key's checkpoints (its object, incarnation gen/owner,
// closed): a waiting capture is dropped, a write in flight finishes, then
// a tombstone replaces the stored checkpoint (a plain delete would let a
// late write of the closed incarnation bring its state back to a new
// object of the same ID), deleted TombstoneFor later at its version
// unless a new object's checkpoint replaced it. Captures submitted
// meanwhile are dropped.
func (w *Writer) Forget(ctx context.Context, key location.AuthorityKey, gen, owner uint64, stableType string) error {
	w.mu.Lock()
	w.forgetting[key] = true
	delete(w.pending, key)
	for w.writing[key] {
		w.cond.Wait()
	}
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.forgetting, key)
		delete(w.versions, key)
		w.mu.Unlock()
	}()
	tomb := Tombstone(gen, owner, stableType)
	data, err := Encode(tomb)
	if err != nil {
		return err
	}
	for try := 0; try < 4; try++ {
		stored, v, err := w.read(key)
		if err != nil && !IsCorrupt(err) {
			return fmt.Errorf("forget the checkpoint of %s: %w", key, err)
		}
		// Also over nothing stored: a first capture still on its way
		// must not land after the close.
		if Judge(tomb.Fence, stored, err) == Superseded {
			return nil // a later object's checkpoint already
		}
		wctx, cancel := machine.WithTimeout(ctx, machine.Or(w.cfg.Clock), w.cfg.Timeout)
		nv, err := w.cfg.Store.PutCheckpoint(wctx, key, v, data)
		cancel()
		var ce *location.ConflictError
		switch {
		case err == nil:
			w.sweepLater(key, nv)
			return nil
		case errors.As(err, &ce):
			continue
		default:
			return fmt.Errorf("forget the checkpoint of %s: %w", key, err)
		}
	}
	return fmt.Errorf("%w: forget the checkpoint of %s: it kept changing", roamerr.ErrConflict, key)
}

// sweepLater deletes key's tombstone at version v once TombstoneFor has
// passed (best effort: a stopped writer leaves it; a new object's
// checkpoint at another version is never deleted).
func (w *Writer) sweepLater(key location.AuthorityKey, v location.StoreVersion) {
	fire, t := machine.NewTimer(machine.Or(w.cfg.Clock), TombstoneFor)
	go func() {
		defer t.Stop()
		select {
		case <-w.stop:
			return
		case <-fire:
		}
		ctx, cancel := machine.WithTimeout(context.Background(), machine.Or(w.cfg.Clock), w.cfg.Timeout)
		defer cancel()
		_ = w.cfg.Store.DeleteCheckpoint(ctx, key, v)
	}()
}

// Idle reports whether nothing waits or is being written.
func (w *Writer) Idle() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.pending) == 0 && w.running == 0
}

// Stop drops what waits and lets writes in flight end (their retries
// stop).
func (w *Writer) Stop() {
	w.mu.Lock()
	if !w.stopped {
		w.stopped = true
		close(w.stop)
		w.pending = map[location.AuthorityKey]Checkpoint{}
		w.queue = nil
	}
	for w.running > 0 {
		w.cond.Wait()
	}
	w.mu.Unlock()
}
