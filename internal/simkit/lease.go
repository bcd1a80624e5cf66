package simkit

import (
	"time"

	"github.com/roamactors/roam/internal/meshnode/lease"
)

// Lease runs one node lifecycle's owner lease on the node's own keeper
// (internal/meshnode/lease) in a world's logical time, as cluster.Node's
// lease loop runs it: every event stepped, a renewal sent when the keeper
// asks, the fence's changes reported, and a look at the clock at each
// wake-up the keeper names. A simulation supplies the renewal's store call
// and what a change of status does to its lifecycle.
type Lease struct {
	keeper *lease.Keeper
	sched  *Sched
	host   LeaseHost
	// wake numbers the keeper's wake-ups: only the latest one armed steps
	// it (a Tick is only a look at the clock).
	wake int
}

// LeaseHost is a simulated node lifecycle, as its lease sees it.
type LeaseHost interface {
	// LeaseLive: the lifecycle still runs its lease (its process is up
	// and the lease has not ended).
	LeaseLive() bool
	// Renew sends one renewal bounded by timeout and calls answer with
	// its outcome, unless the lifecycle is gone by then.
	Renew(timeout time.Duration, answer func(lease.Answer))
	// LeaseChanged: the keeper's status became s (lease.Ended: the
	// lifecycle ends; lease.Valid: its fence lifted; lease.Fenced).
	LeaseChanged(s lease.Status, reason string)
}

// StartLease starts the lease of a lifecycle whose claim, sent at
// claimSent, succeeded.
func StartLease(cfg lease.Config, claimSent time.Duration, sched *Sched, host LeaseHost) (*Lease, error) {
	k, err := lease.New(cfg, Wall(claimSent))
	if err != nil {
		return nil, err
	}
	l := &Lease{keeper: k, sched: sched, host: host}
	l.step(lease.Tick{Now: Wall(sched.Now())})
	return l, nil
}

// ValidUntil is when the lifecycle stops acting as the owner unless a
// later renewal proves the lease (the keeper's ValidUntil).
func (l *Lease) ValidUntil() time.Duration { return Logical(l.keeper.ValidUntil()) }

func (l *Lease) step(ev lease.Event) {
	if !l.host.LeaseLive() {
		return
	}
	eff := l.keeper.Step(ev)
	if eff.Changed {
		l.host.LeaseChanged(l.keeper.Status(), eff.Reason)
		if l.keeper.Status() == lease.Ended {
			return
		}
	}
	if eff.Renew {
		sent := l.sched.Now()
		l.host.Renew(l.keeper.RequestTimeout(), func(a lease.Answer) {
			l.step(lease.RenewAnswered{SentAt: Wall(sent), Now: Wall(l.sched.Now()), Answer: a})
		})
	}
	l.wake++
	wake := l.wake
	l.sched.At(max(Logical(eff.WakeAt), l.sched.Now()), func() {
		if wake == l.wake {
			l.step(lease.Tick{Now: Wall(l.sched.Now())})
		}
	})
}
