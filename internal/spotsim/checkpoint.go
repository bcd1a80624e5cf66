package spotsim

import (
	"strconv"
	"time"

	"github.com/roamactors/roam/internal/checkpoint"
	"github.com/roamactors/roam/internal/simkit"
)

// The checkpoints of the stateful Spots (docs/FAULTS.md, "Checkpoints and
// recovery"), modelled the way internal/relocation and
// internal/checkpoint run them: an incarnation captures its state (the
// messages whose effects it holds) after every handled message, except
// while its cold activation's recovery pointer may still be in the store;
// the node's writer checks its lease, then the write travels for a while
// and lands — also long after its lifecycle ended — judged against what is
// stored by checkpoint.Judge, the real rule; a claim rewrites the stored
// checkpoint under the new incarnation's fence (atomically: read and
// compare-and-set); a close leaves checkpoint.Tombstone. The checker then
// asks of every incarnation that opens: its state is a prefix of the
// history of the incarnation it replaces (no fork, nothing of another
// branch), and empty after a close.

// simCheckpoint is one stored checkpoint.
type simCheckpoint struct {
	fence   checkpoint.Fence
	state   []*Msg
	noState bool
}

// capture is the capture after inc's turn (object.turnEnded with
// CheckpointEvery 1).
func (w *World) capture(inc *Inc) {
	if !inc.spot.kind.Checkpointed || inc.mode != mOpen {
		return
	}
	if (inc.afterFirst != nil || inc.pointerHeld) && w.cfg.Sabotage != SabotageCaptureUnderPointer {
		return
	}
	inc.seq++
	fence := checkpoint.Fence{ObjectGeneration: inc.pid.gen, OwnerGeneration: inc.pid.ownerGen, Sequence: inc.seq}
	state := append([]*Msg(nil), inc.state()...)
	l, s := inc.life, inc.spot
	// The writer's queue and its lease check, then the store call, which
	// a slow or cut network may deliver late. A script's fault replaces a
	// drawn delay after the draw, so it changes no other draw.
	queued := w.randDur(0, 2*time.Millisecond)
	if _, late, ok := w.checkpointFault(l, opCapture, s); ok && late > 0 {
		queued = late
	}
	w.after(queued, func() {
		if !l.valid() && w.cfg.Sabotage != SabotageCheckpointNoLease {
			w.stats.CheckpointsFenced++
			if w.Tracing() {
				w.tracef("checkpoint of %s at %s dropped: %s is fenced", s.id, fence, l)
			}
			return
		}
		w.checkWriterLease(l, inc, fence)
		delay := w.randDur(100*time.Microsecond, 2*time.Millisecond)
		if !w.over && w.chance(w.faults.PSlow) {
			delay = w.randDur(0, w.faults.SlowFor)
		}
		if mode, late, ok := w.checkpointFault(l, opCheckpoint, s); ok {
			if mode == simkit.ModeUnavailable {
				w.tracef("checkpoint of %s at %s lost on its way to the store", s.id, fence)
				return // the writer's next capture carries the state
			}
			if late > 0 {
				delay = late
			}
		}
		w.after(delay, func() { w.landCheckpoint(s, inc, fence, state, false) })
	})
}

// checkpointFault is a script's answer to a checkpoint call, if one of its
// faults matches (Hooks.StoreMode).
func (w *World) checkpointFault(l *Life, kind opKind, s *Spot) (simkit.StoreMode, time.Duration, bool) {
	if w.hooks.StoreMode == nil {
		return simkit.ModeOK, 0, false
	}
	return w.hooks.StoreMode(w, l, &storeOp{kind: kind, key: s.key(), why: opNames[kind] + " " + s.id})
}

// landCheckpoint applies one write of by at the store: only above the
// stored fence (checkpoint.Judge).
func (w *World) landCheckpoint(s *Spot, by *Inc, fence checkpoint.Fence, state []*Msg, noState bool) {
	var stored *checkpoint.Checkpoint
	if cp := w.cps[s.idx]; cp != nil {
		stored = &checkpoint.Checkpoint{Fence: cp.fence}
	}
	if checkpoint.Judge(fence, stored, nil) == checkpoint.Superseded && w.cfg.Sabotage != SabotageCheckpointNoJudge {
		w.stats.CheckpointsSuperseded++
		if w.Tracing() {
			w.tracef("checkpoint of %s at %s by %s superseded by %s", s.id, fence, by, cpString(w.cps[s.idx]))
		}
		return
	}
	w.checkWriterFence(s, by, fence, state)
	w.cpsPrev[s.idx] = w.cps[s.idx]
	w.cps[s.idx] = &simCheckpoint{fence: fence, state: state, noState: noState}
	w.stats.CheckpointsWritten++
	if w.Tracing() {
		w.tracef("checkpoint of %s at %s by %s: %s", s.id, fence, by, msgList(state))
	}
}

// claim is Driver.ClaimCheckpoint: the stored state under the new fence;
// the answer's State names a snapshot (restore false: none stored).
func (w *World) claim(s *Spot, gen, ownerGen uint64) (state []byte, restore bool) {
	w.stats.Claims++
	w.claimed(s)
	cp := w.cps[s.idx]
	if w.cfg.Sabotage == SabotageClaimOlder {
		cp = w.cpsPrev[s.idx]
	}
	fence := checkpoint.Fence{ObjectGeneration: gen, OwnerGeneration: ownerGen}
	if w.Tracing() {
		w.tracef("checkpoint of %s claimed at %s: %s", s.id, fence, cpString(cp))
	}
	if cp == nil {
		return nil, false
	}
	if w.cfg.Sabotage != SabotageClaimNoFence {
		w.cpsPrev[s.idx] = w.cps[s.idx]
		w.cps[s.idx] = &simCheckpoint{fence: fence, state: cp.state, noState: cp.noState}
	}
	if cp.noState {
		return nil, false
	}
	w.snapshots = append(w.snapshots, cp.state)
	return []byte(strconv.Itoa(len(w.snapshots) - 1)), true
}

// restore gives a staged incarnation the state a claim returned.
func (w *World) restore(inc *Inc, state []byte) {
	i, err := strconv.Atoi(string(state))
	if err != nil || i < 0 || i >= len(w.snapshots) {
		panic("spotsim: a Stage with a state no claim returned")
	}
	inc.restored = append([]*Msg(nil), w.snapshots[i]...)
	inc.seq = 0
	w.stats.Restores++
}

// forget is the close's tombstone (Writer.Forget).
func (w *World) forget(inc *Inc) {
	s := inc.spot
	if !s.kind.Checkpointed {
		return
	}
	if w.cfg.Sabotage != SabotageNoTombstone {
		t := checkpoint.Tombstone(inc.pid.gen, inc.pid.ownerGen, s.stableType)
		w.landCheckpoint(s, inc, t.Fence, nil, true)
	}
	w.closedCheckpoints(inc)
}

// state is what inc's state holds: what it restored, then what it handled.
func (inc *Inc) state() []*Msg {
	if len(inc.restored) == 0 {
		return inc.handled
	}
	return append(append([]*Msg(nil), inc.restored...), inc.handled...)
}
