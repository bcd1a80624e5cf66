package activation

import (
	"errors"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/internal/machine/loglevel"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

// Clear removes a recovery pointer by expected-version compare-and-set
// once the first handler has completed, then deletes the root
// (docs/PROTOCOL.md §7.5 step 12). Its first attempt writes over the record
// as committed Ready, if it knows it, without reading: a landed write is
// the removal. Otherwise, and after that write lost or left its outcome
// unknown, it reads again before every attempt, so a record rewritten
// meanwhile (a move) is handled, and it is done when a read shows the
// pointer gone (or naming another activation). A failed read or
// write is tried again after ClearBackoff; ClearFor after its start it
// gives up (activation_recovery_clear_failed), and at once when this
// node's lease has ended: such a write is never retried under that lease.
type Clear struct {
	cfg      Config
	key      location.AuthorityKey
	op       string
	rootKey  string
	deadline time.Time
	now      time.Time
	expired  bool
	phase    Phase
	finished bool
	// blind: the write under way was made without a read, over the
	// record as committed; landed, it removed the pointer.
	blind bool
	// rootGone: a removal that deleted the root in its own transaction
	// (Config.RootsInApply) landed.
	rootGone bool
}

// NewClear starts the removal of the pointer of operation op on key, whose
// root is rootKey, at now. committed is the record the activation
// committed Ready, at its version, if known (else zero).
func NewClear(cfg Config, key location.AuthorityKey, op, rootKey string, committed location.Versioned, now time.Time) (*Clear, []Effect) {
	c := &Clear{cfg: cfg, key: key, op: op, rootKey: rootKey, deadline: now.Add(cfg.ClearFor), now: now, phase: ClearReading}
	start := []Effect{StartTimer{Timer: TimerDeadline, At: c.deadline}}
	if committed.Present() && committed.Key == key && committed.Record.GetActivationRecovery().GetOperationId() == op &&
		committed.Record.GetState() == messages.LifecycleState_LIFECYCLE_STATE_READY {
		c.blind = true
		return c, append(start, c.write(committed)...)
	}
	return c, append(start, ReadRecord{Key: key})
}

// Phase is the current phase.
func (c *Clear) Phase() Phase { return c.phase }

// Finished reports whether the machine has emitted Finish.
func (c *Clear) Finished() bool { return c.finished }

// Step feeds one event and returns the effects to run, in order.
func (c *Clear) Step(ev Event) []Effect {
	if c.finished {
		return nil
	}
	if now, ok := nowOf(ev); ok && !now.IsZero() {
		c.now = now
	}
	switch ev := ev.(type) {
	case RecordRead:
		if c.phase != ClearReading {
			return nil
		}
		rec := ev.Record.Record
		switch {
		case errors.Is(ev.Err, location.ErrNotFound):
			return c.cleared()
		case ev.Err != nil:
			return c.wait()
		case rec.GetActivationRecovery().GetOperationId() != c.op:
			return c.cleared()
		case rec.GetState() != messages.LifecycleState_LIFECYCLE_STATE_READY:
			// Closing: the release removes record and root together.
			return c.finish(PointerLeftToRelease)
		}
		return c.write(ev.Record)

	case WriteAnswered:
		if c.phase != ClearWriting {
			return nil
		}
		blind := c.blind
		c.blind = false
		if ev.Err == nil && c.cfg.RootsInApply {
			c.rootGone = true
		}
		switch {
		case ev.Err == nil && blind:
			return c.cleared()
		case ev.Err == nil, errors.Is(ev.Err, location.ErrConflict), errors.Is(ev.Err, location.ErrIndeterminate):
			return c.read() // done when a read shows the pointer gone
		case errors.Is(ev.Err, location.ErrLeaseEnded):
			return c.finish(ClearGaveUp, Log{Level: loglevel.Warn, Event: "activation_recovery_clear_failed", SpotID: c.key.ID,
				Msg: "this node's lease ended before the recovery pointer was removed: the node that resumes the activation runs its first message again"})
		}
		return c.wait()

	case TimerFired:
		switch ev.Timer {
		case TimerRetry:
			if c.phase == ClearWaiting {
				return c.read()
			}
		case TimerDeadline:
			c.expired = true
			if c.phase == ClearWaiting {
				return c.giveUp()
			}
		}
	}
	return nil
}

// write removes the pointer from v's record by compare-and-set on its
// version, and the root with it where one transaction may carry both.
func (c *Clear) write(v location.Versioned) []Effect {
	without := proto.Clone(v.Record).(*location.Record)
	without.ActivationRecovery = nil
	c.phase = ClearWriting
	w := CompareAndSet{Key: c.key, Expected: v.Version, Record: without}
	if c.cfg.RootsInApply {
		w.DeleteRoot = c.rootKey
	}
	return []Effect{w}
}

func (c *Clear) expiredNow() bool { return c.expired || passed(c.deadline, c.now) }

func (c *Clear) read() []Effect {
	if c.expiredNow() {
		return c.giveUp()
	}
	c.phase = ClearReading
	return []Effect{ReadRecord{Key: c.key}}
}

func (c *Clear) wait() []Effect {
	if c.expiredNow() {
		return c.giveUp()
	}
	c.phase = ClearWaiting
	return []Effect{StartTimer{Timer: TimerRetry, After: c.cfg.ClearBackoff}}
}

func (c *Clear) cleared() []Effect {
	effects := []Effect{}
	if c.rootKey != "" && !c.rootGone {
		effects = append(effects, DeleteRoot{RootKey: c.rootKey})
	}
	return c.finish(PointerCleared, effects...)
}

// giveUp ends a removal the store refused for ClearFor while this node's
// lease lived. The incarnation dispatches again (it cannot wait for good),
// so from here a resume after this owner's end would lose what later
// messages did: an error.
func (c *Clear) giveUp() []Effect {
	return c.finish(ClearGaveUp, Log{Level: loglevel.Error, Event: "activation_recovery_clear_failed", SpotID: c.key.ID,
		Msg: "the recovery pointer stays and the Spot serves on: if this owner ends, the Spot is resumed from its first message alone, without what later messages did"})
}

func (c *Clear) finish(p Phase, before ...Effect) []Effect {
	c.phase = p
	c.finished = true
	return append(before, Finish{})
}
