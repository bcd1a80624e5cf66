package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
//
// The Writer runs on a machine.Loop: its bookkeeping below is owned by the
// loop's turns and has no lock. The store calls of a write run on a
// goroutine that posts the outcome back as a turn; Claim and Forget make
// theirs on their caller's goroutine and step the bookkeeping in turns.
// The tombstone sweeps are the loop's timers, on the node's clock.
type Writer struct {
	cfg  Config
	loop *machine.Loop[sweep]
	// pace holds the pauses before a failed write is tried again, each
	// firing as a turn. They only spare a failing store and decide
	// nothing, so they stay on the real clock: a node in logical time
	// retries without the test moving its clock.
	pace *machine.Timers[location.AuthorityKey]
	// calls counts the goroutines making a write's or a sweep's store
	// calls; Stop waits for them.
	calls sync.WaitGroup
	// drained closes in the turn in which a stopped Writer's last write
	// ended.
	drained chan struct{}
	// sweeps bounds the tombstone sweeps' store calls: best effort, they
	// end with Stop (stopSweeps) instead of holding it for their timeout,
	// which on a node's logical clock may never come.
	sweeps     context.Context
	stopSweeps context.CancelFunc

	// Owned by the loop's turns.
	pending map[location.AuthorityKey]submitted
	queue   []location.AuthorityKey
	writing map[location.AuthorityKey]*inflight
	// versions: the version this node last wrote or read for an object,
	// so a steady owner's write is one compare-and-set, no read. An
	// object whose submitter keeps it (Tracker) has an entry only until
	// its next write ends: an entry each would cost every idle object
	// that checkpoints about 40 bytes.
	versions   map[location.AuthorityKey]location.StoreVersion
	forgetting map[location.AuthorityKey]bool
	stopped    bool
	failLog    ratelog.Limiter
	// idle: the WaitIdle calls waiting for nothing to wait or be written.
	idle []chan struct{}

	// Counted by the turns; atomic so that Stats reads them from any
	// goroutine, after Stop too.
	written, superseded, coalesced, failed, fenced atomic.Uint64
}

// sweep names the timer that deletes key's tombstone stored at version v
// (one per tombstone: a key forgotten twice has two).
type sweep struct {
	key location.AuthorityKey
	v   location.StoreVersion
}

// submitted is a capture waiting to be written, and what its submitter
// is told once it landed (nil: nothing).
type submitted struct {
	c       Checkpoint
	landed  func(location.StoreVersion)
	tracker Tracker
}

// Tracker is what the submitter of an object's captures knows of its
// stored checkpoint, kept by the submitter (beside the object) rather
// than in the Writer. Its methods run on the Writer's loop and must not
// block.
type Tracker interface {
	// Known is the stored checkpoint's version as last learned (ok
	// false: unknown; 0 with ok: none is stored).
	Known() (v location.StoreVersion, ok bool)
	// Landed: the capture with fence f is stored at v.
	Landed(v location.StoreVersion, f Fence)
}

// inflight is the write of one object under way: its store calls, or the
// pause before they are made again.
type inflight struct {
	submitted
	attempt int
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
	sweeps, stopSweeps := context.WithCancel(context.Background())
	return &Writer{
		sweeps: sweeps, stopSweeps: stopSweeps,
		cfg: cfg, loop: machine.NewLoop[sweep](machine.Or(cfg.Clock)), pace: machine.NewTimers[location.AuthorityKey](machine.Real),
		drained: make(chan struct{}), pending: map[location.AuthorityKey]submitted{}, writing: map[location.AuthorityKey]*inflight{},
		versions: map[location.AuthorityKey]location.StoreVersion{}, forgetting: map[location.AuthorityKey]bool{},
		failLog: ratelog.Limiter{Every: time.Second},
	}
}

// Stats returns the counts so far.
func (w *Writer) Stats() Stats {
	return Stats{Written: w.written.Load(), Superseded: w.superseded.Load(), Coalesced: w.coalesced.Load(),
		Failed: w.failed.Load(), Fenced: w.fenced.Load()}
}

// Submit queues c, the newest capture of key. It returns at once.
func (w *Writer) Submit(key location.AuthorityKey, c Checkpoint) {
	w.SubmitThen(key, c, nil)
}

// SubmitThen is Submit, and calls landed with the stored version once c
// itself is stored (not when it is superseded, replaced by a newer
// capture, or dropped). landed runs on the Writer's loop: it must not
// block.
func (w *Writer) SubmitThen(key location.AuthorityKey, c Checkpoint, landed func(location.StoreVersion)) {
	// Refused once stopped: dropped, as Stop drops what waits.
	w.loop.Post(func() { w.submit(key, submitted{c: c, landed: landed}) })
}

// SubmitTracked is Submit for a submitter that keeps what it knows of
// key's stored version (t): the write starts from t.Known unless the
// Writer learned the version since (Claim, SetVersion), and t.Landed is
// told where c landed.
func (w *Writer) SubmitTracked(key location.AuthorityKey, c Checkpoint, t Tracker) {
	w.loop.Post(func() { w.submit(key, submitted{c: c, tracker: t}) })
}

// SetVersion records that key's stored checkpoint is at v, as an earlier
// owner knew it (a move's source): the next write of key is then one
// compare-and-set, no read. A version that is no longer stored costs that
// write a conflict and a read, nothing else.
func (w *Writer) SetVersion(key location.AuthorityKey, v location.StoreVersion) {
	w.setVersion(key, v)
}

func (w *Writer) submit(key location.AuthorityKey, c submitted) {
	if w.stopped || w.forgetting[key] {
		return
	}
	if old, ok := w.pending[key]; ok {
		if !c.c.Fence.Less(old.c.Fence) {
			w.pending[key] = c
		}
		w.coalesced.Add(1)
		return
	}
	w.pending[key] = c
	w.queue = append(w.queue, key)
	w.start()
}

// start starts writes while there is room.
func (w *Writer) start() {
	for len(w.writing) < w.cfg.Concurrency && len(w.queue) > 0 {
		key := w.queue[0]
		w.queue = w.queue[1:]
		c, ok := w.pending[key]
		if !ok || w.writing[key] != nil {
			continue // written meanwhile, or re-queued once its write ends
		}
		delete(w.pending, key)
		wr := &inflight{submitted: c}
		w.writing[key] = wr
		w.attempt(key, wr)
	}
}

// attempt makes wr's store calls on a goroutine, which posts their
// outcome back.
func (w *Writer) attempt(key location.AuthorityKey, wr *inflight) {
	v, known := w.versions[key]
	if !known && wr.tracker != nil {
		v, known = wr.tracker.Known()
	}
	w.calls.Add(1)
	machine.Go(func() {
		defer w.calls.Done()
		out := w.write(key, wr.c, v, known)
		// Not refused: the loop closes only once every write has ended.
		w.loop.Post(func() { w.attempted(key, wr, out) })
	})
}

// outcome is what one attempt of a write did.
type outcome struct {
	err error
	// version: what the attempt learned of the stored version (setV: v is
	// it; forgetV: it is unknown now; neither: unchanged).
	v             location.StoreVersion
	setV, forgetV bool
	count         *atomic.Uint64 // the Stats field it adds to, if any
}

// attempted steps the outcome of one attempt of key's write: it ends, or
// is tried again after a pause.
func (w *Writer) attempted(key location.AuthorityKey, wr *inflight, out outcome) {
	switch {
	case out.setV && wr.tracker != nil:
		// Its submitter keeps it: told below if it is its write's, and
		// a version this write only read costs at most one conflict.
		delete(w.versions, key)
	case out.setV:
		w.versions[key] = out.v
	case out.forgetV:
		delete(w.versions, key)
	}
	if out.count != nil {
		out.count.Add(1)
	}
	if out.count == &w.written {
		if wr.landed != nil {
			wr.landed(out.v)
		}
		if wr.tracker != nil {
			wr.tracker.Landed(out.v, wr.c.Fence)
		}
	}
	if err := out.err; err != nil {
		w.failed.Add(1)
		if ev := w.failLog.Warn(&w.cfg.Log); ev != nil {
			ev.Str("event", "checkpoint_write_failed").Str("object_id", key.ID).Str("object_kind", location.KindName(key.Kind)).
				Str("fence", wr.c.Fence.String()).Err(err).Msg("a checkpoint could not be written; retried while no newer capture waits")
		}
		_, newer := w.pending[key]
		gone := w.stopped || w.forgetting[key]
		if !newer && !gone && !errors.Is(err, roamerr.ErrInvalidOperation) && !errors.Is(err, roamerr.ErrCapacityExceeded) {
			pause := min(50*time.Millisecond<<min(wr.attempt, 5), time.Second)
			wr.attempt++
			w.pace.Post(key, pause, func(f machine.Fired[location.AuthorityKey]) {
				w.loop.Post(func() {
					if w.pace.Take(f) {
						w.attempt(key, wr)
					}
				})
			})
			return
		}
		// A newer capture replaces it; or it can never be written.
	}
	w.ended(key)
}

// ended ends key's write: a capture that came meanwhile is queued, and a
// stopped Writer whose last write this was is drained.
func (w *Writer) ended(key location.AuthorityKey) {
	delete(w.writing, key)
	if _, ok := w.pending[key]; ok {
		w.queue = append(w.queue, key)
	}
	w.start()
	w.drain()
	w.wakeIdle()
}

// wakeIdle lets the WaitIdle calls go on once nothing waits or is being
// written. Every turn that empties pending or writing calls it.
func (w *Writer) wakeIdle() {
	if len(w.pending) > 0 || len(w.writing) > 0 {
		return
	}
	for _, ch := range w.idle {
		close(ch)
	}
	w.idle = nil
}

// drain closes drained once the Writer is stopped and no write is left.
func (w *Writer) drain() {
	if !w.stopped || len(w.writing) > 0 {
		return
	}
	select {
	case <-w.drained:
	default:
		close(w.drained)
	}
}

// endPause ends key's write if it is pausing before its next attempt (a
// write whose store calls are under way ends with their outcome).
func (w *Writer) endPause(key location.AuthorityKey) {
	if w.writing[key] != nil && w.pace.Cancel(key) {
		w.ended(key)
	}
}

// write stores c unless the store holds the same or a later checkpoint;
// v is the stored version as last known (known).
func (w *Writer) write(key location.AuthorityKey, c Checkpoint, v location.StoreVersion, known bool) outcome {
	if err := w.cfg.Lease(); err != nil {
		return outcome{count: &w.fenced}
	}
	data, err := Encode(c)
	if err != nil {
		return outcome{err: err}
	}
	if len(data) > location.MaxCheckpointBytes {
		return outcome{err: fmt.Errorf("%w: the state of %s is %d bytes, over the checkpoint limit %d", roamerr.ErrCapacityExceeded, key, len(c.State), location.MaxCheckpointBytes)}
	}
	for try := 0; try < 4; try++ {
		if !known {
			stored, sv, err := w.read(key)
			if err != nil && !IsCorrupt(err) {
				return outcome{err: err}
			}
			v = sv
			if Judge(c.Fence, stored, err) == Superseded {
				return outcome{v: v, setV: true, count: &w.superseded}
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
			return outcome{v: nv, setV: true, count: &w.written}
		case errors.As(err, &ce):
			known = false // read, and judge again
		default:
			return outcome{err: err, forgetV: true}
		}
	}
	return outcome{err: fmt.Errorf("%w: the checkpoint of %s kept changing under its write", roamerr.ErrConflict, key)}
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

// setVersion and forgetVersion record, from a caller's goroutine, what a
// Claim or Forget learned of the stored version. Posted, not waited for:
// the caller's later calls are turns after it.
func (w *Writer) setVersion(key location.AuthorityKey, v location.StoreVersion) {
	w.loop.Post(func() { w.versions[key] = v })
}

func (w *Writer) forgetVersion(key location.AuthorityKey) {
	w.loop.Post(func() { delete(w.versions, key) })
}

// do runs f as a turn for a caller of op and waits for it; its error says
// why f did not run (the caller's ctx ended, or the Writer stopped).
func (w *Writer) do(ctx context.Context, op string, f func()) error {
	err := w.loop.Do(ctx, f)
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil && !errors.Is(err, machine.ErrClosed):
		return fmt.Errorf("%w: %s: %w", roamerr.ErrDeadlineExceeded, op, err)
	}
	return fmt.Errorf("%s: %w", op, err)
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
// the claim fails: a newer node reads it. A stopped Writer claims and
// forgets nothing (machine.ErrClosed, Unavailable): its lifecycle ended.
func (w *Writer) Claim(ctx context.Context, key location.AuthorityKey, fence Fence, stableType, appVersion string) (Checkpoint, error) {
	err := w.do(ctx, "claim the checkpoint of "+key.String(), func() {
		if c, ok := w.pending[key]; ok && c.c.Fence.Less(fence) {
			delete(w.pending, key) // an earlier incarnation's capture here
			w.coalesced.Add(1)
			w.wakeIdle()
		}
	})
	if err != nil {
		return Checkpoint{}, err
	}
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
// closed): a waiting capture is dropped, a retry's pause ends the write
// pausing, and a tombstone replaces the stored checkpoint (a plain delete
// would let a late write of the closed incarnation bring its state back
// to a new object of the same ID), deleted TombstoneFor later at its
// version unless a new object's checkpoint replaced it. Captures
// submitted meanwhile are dropped. A write whose store calls are under
// way is not waited for: the store orders its compare-and-set and the
// tombstone's, and whichever comes second conflicts and is judged again —
// the write is superseded by the tombstone, which ranks above every
// capture of the incarnation; the tombstone goes over the write. Waiting
// for it instead would let a slow store keep the tombstone from being
// written at all within the caller's deadline.
func (w *Writer) Forget(ctx context.Context, key location.AuthorityKey, gen, owner uint64, stableType string) error {
	op := "forget the checkpoint of " + key.String()
	err := w.do(ctx, op, func() {
		w.forgetting[key] = true
		delete(w.pending, key)
		w.endPause(key) // its next attempt would only be fenced out
		w.wakeIdle()
	})
	// Posted, so that it follows the turn above even when that turn ran
	// after do gave up on it; and the caller's later calls follow it.
	var swept location.StoreVersion
	tombstoned := false
	defer w.loop.Post(func() {
		delete(w.forgetting, key)
		delete(w.versions, key)
		if tombstoned && !w.stopped {
			w.loop.Arm(sweep{key, swept}, TombstoneFor, func() { w.sweep(key, swept) })
		}
	})
	if err != nil {
		return err
	}
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
			swept, tombstoned = nv, true
			return nil
		case errors.As(err, &ce):
			continue
		default:
			return fmt.Errorf("forget the checkpoint of %s: %w", key, err)
		}
	}
	return fmt.Errorf("%w: forget the checkpoint of %s: it kept changing", roamerr.ErrConflict, key)
}

// sweep deletes key's tombstone at version v, TombstoneFor after it was
// written (best effort: a stopped writer leaves it; a new object's
// checkpoint at another version is never deleted).
func (w *Writer) sweep(key location.AuthorityKey, v location.StoreVersion) {
	w.calls.Add(1)
	machine.Go(func() {
		defer w.calls.Done()
		ctx, cancel := machine.WithTimeout(w.sweeps, machine.Or(w.cfg.Clock), w.cfg.Timeout)
		defer cancel()
		_ = w.cfg.Store.DeleteCheckpoint(ctx, key, v)
	})
}

// Idle reports whether nothing waits or is being written.
func (w *Writer) Idle() bool {
	idle := true
	if err := w.loop.Do(context.Background(), func() { idle = len(w.pending) == 0 && len(w.writing) == 0 }); err != nil {
		return true // closed: Stop dropped what waited, and every write ended
	}
	return idle
}

// WaitIdle waits until nothing waits or is being written — the end of a
// flush — or ctx ends (DeadlineExceeded). A stopped Writer is idle: Stop
// dropped what waited, and its writes ended.
func (w *Writer) WaitIdle(ctx context.Context) error {
	var idle chan struct{}
	err := w.do(ctx, "wait for the checkpoint writes", func() {
		if len(w.pending) > 0 || len(w.writing) > 0 {
			idle = make(chan struct{})
			w.idle = append(w.idle, idle)
		}
	})
	switch {
	case errors.Is(err, machine.ErrClosed):
		return nil
	case err != nil:
		return err
	case idle == nil:
		return nil
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		// A caller that gives up takes its waiter away: a Writer that is
		// never idle again (a failing store, retried) would keep every one.
		w.loop.Post(func() {
			if i := slices.Index(w.idle, idle); i >= 0 {
				w.idle = slices.Delete(w.idle, i, i+1)
			}
		})
		return fmt.Errorf("%w: wait for the checkpoint writes: %w", roamerr.ErrDeadlineExceeded, ctx.Err())
	}
}

// Stop drops what waits and lets writes in flight end (their retries
// stop), then ends the loop with its timers and waits for the store calls
// it started.
func (w *Writer) Stop() {
	_ = w.loop.Do(context.Background(), func() { // ErrClosed: stopped already
		if w.stopped {
			return
		}
		w.stopped = true
		w.pending = map[location.AuthorityKey]submitted{}
		w.queue = nil
		w.loop.CancelIf(func(sweep) bool { return true })
		for key := range w.writing {
			w.endPause(key)
		}
		w.drain()
		w.wakeIdle()
	})
	<-w.drained
	w.loop.Close()
	<-w.loop.Done()
	w.pace.Close()
	w.stopSweeps()
	w.calls.Wait()
}
