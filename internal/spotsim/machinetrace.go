package spotsim

import (
	"crypto/sha256"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/roamactors/roam/internal/activation"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

// apply runs a transaction of this lifecycle (its lease check added by
// the store), answering only while the runner lives.
func (r *Runner) apply(ops []location.Op, why string, deadline time.Duration, done func(storeRes)) {
	r.w.store.call(r.life, storeOp{kind: opApply, key: ops[0].Key, ops: ops, holder: r.first, why: why + " " + ops[0].Key.ID}, deadline, done)
}

// rootRef is a root's reference: its key and a digest of its content.
func rootRef(key string, first *Msg) location.RootRef {
	return location.RootRef{Key: key, SHA256: sha256.Sum256([]byte(key)), Size: uint64(64 + first.id%7)}
}

// logged counts a machine's log lines (and traces them).
func (w *World) logged(r *Runner, l activation.Log) {
	switch l.Event {
	case "activation_resumed":
		w.stats.Resumed++
	case "reactivation_refused":
		w.stats.RefusedPreserved++
	case "spot_reactivated":
		w.stats.ReactivatedEmpty++
	case "activation_recovery_clear_failed":
		w.stats.ClearGaveUp++
	case "activation_failed":
		w.stats.ActivationFailed++
		if r.first != nil && !r.first.request {
			// A send has nobody to answer: the log line and the counter
			// are its loud failure (RespondFailure above recorded it).
		}
	}
	if w.Tracing() {
		msg := l.Event
		if l.Err != nil {
			msg += ": " + l.Err.Error()
		}
		w.tracef("%s log %s", r, msg)
	}
}

func stateName(rec *location.Record) string {
	switch rec.GetState() {
	case messages.LifecycleState_LIFECYCLE_STATE_CREATING:
		return "Creating"
	case messages.LifecycleState_LIFECYCLE_STATE_READY:
		if rec.GetActivationRecovery() == nil {
			return "Ready(no pointer)"
		}
		return "Ready"
	case messages.LifecycleState_LIFECYCLE_STATE_CLOSING:
		return "Closing"
	}
	return "?"
}

// ---- trace formatting ----

func eventString(ev activation.Event) string {
	switch ev := ev.(type) {
	case activation.AuthorityRead:
		if ev.Err != nil {
			return "AuthorityRead(" + errString(ev.Err) + ")"
		}
		s := "AuthorityRead(" + recString(ev.Authority.Versioned)
		if ev.Authority.OwnerEnded {
			s += " ended"
		}
		if ev.Authority.Hosted {
			s += " hosted"
		}
		return s + ")"
	case activation.WriteAnswered:
		if ev.Err != nil {
			return "WriteAnswered(" + errString(ev.Err) + ")"
		}
		return fmt.Sprintf("WriteAnswered(v%d)", ev.Version)
	case activation.RecordRead:
		if ev.Err != nil {
			return "RecordRead(" + errString(ev.Err) + ")"
		}
		return "RecordRead(" + recString(ev.Record) + ")"
	case activation.TimerFired:
		return "Timer(" + ev.Timer.String() + ")"
	case activation.RootGot:
		if ev.Err != nil {
			return "RootGot(" + errString(ev.Err) + ")"
		}
		return "RootGot(" + ev.Operation + ")"
	case activation.OwnerRead:
		if ev.Err != nil {
			return "OwnerRead(" + errString(ev.Err) + ")"
		}
		return fmt.Sprintf("OwnerRead(alive=%v)", ev.Alive)
	case activation.PassedOn:
		return fmt.Sprintf("PassedOn(%v)", ev.OK)
	}
	s := reflect.TypeOf(ev).Name()
	if err := eventErr(ev); err != nil {
		s += "(" + errString(err) + ")"
	}
	return s
}

func eventErr(ev activation.Event) error {
	switch ev := ev.(type) {
	case activation.Watched:
		return ev.Err
	case activation.CapacityAdmitted:
		return ev.Err
	case activation.RootPut:
		return ev.Err
	case activation.Staged:
		return ev.Err
	case activation.Opened:
		return ev.Err
	case activation.AbortAnswered:
		return ev.Err
	case activation.Deleted:
		return ev.Err
	case activation.LocalClosed:
		return ev.Err
	}
	return nil
}

func effectsString(effects []activation.Effect) string {
	parts := make([]string, 0, len(effects))
	for _, e := range effects {
		switch e := e.(type) {
		case activation.StartTimer:
			parts = append(parts, "StartTimer("+e.Timer.String()+")")
		case activation.StopTimer:
			parts = append(parts, "StopTimer("+e.Timer.String()+")")
		case activation.Log:
			parts = append(parts, "Log("+e.Event+")")
		case activation.Finish:
			if e.Err != nil {
				parts = append(parts, "Finish("+code(e.Err)+")")
			} else {
				parts = append(parts, "Finish")
			}
		case activation.CompareAndSet:
			parts = append(parts, fmt.Sprintf("CompareAndSet(v%d %s)", e.Expected, stateName(e.Record)))
		case activation.Reserve:
			parts = append(parts, fmt.Sprintf("Reserve(v%d)", e.Expected))
		case activation.Measure:
		default:
			parts = append(parts, reflect.TypeOf(e).Name())
		}
	}
	return "[" + strings.Join(parts, " ") + "]"
}
