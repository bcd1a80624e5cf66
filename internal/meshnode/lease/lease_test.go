package lease

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func keeper(t *testing.T) *Keeper {
	t.Helper()
	k, err := New(Config{TTL: 10 * time.Second}, t0)
	require.NoError(t, err)
	return k
}

// Renewals that succeed keep the node Valid; each one proves the lease from
// its send time, not from its answer. Reference: docs/FAULTS.md ("Lease
// fencing"), docs/PROTOCOL.md §2.2 (owner lease).
func TestRenewalsKeepTheLeaseValid(t *testing.T) {
	k := keeper(t)
	now := t0
	for i := 0; i < 20; i++ {
		eff := k.Step(Tick{Now: now})
		require.Equal(t, Valid, k.Status())
		if eff.Renew {
			sent := now
			now = now.Add(900 * time.Millisecond) // a slow answer
			k.Step(RenewAnswered{SentAt: sent, Now: now, Answer: Renewed})
			require.Equal(t, sent.Add(10*time.Second-2*time.Second), k.ValidUntil())
			continue
		}
		require.True(t, eff.WakeAt.After(now))
		now = eff.WakeAt
	}
}

// Without a proof the node fences itself at the claim's send time plus TTL
// minus the margin — before the earliest instant the store could end the
// lease — and tells the driver when to wake for it.
// Reference: PROTOCOL.md §10 (one owner at a time); docs/FAULTS.md.
func TestNoProofFencesBeforeTheTTL(t *testing.T) {
	k := keeper(t)
	now := t0
	var fencedAt time.Time
	for now.Before(t0.Add(30 * time.Second)) {
		eff := k.Step(Tick{Now: now})
		if eff.Changed && k.Status() == Fenced {
			fencedAt = now
			break
		}
		if eff.Renew {
			eff = k.Step(RenewAnswered{SentAt: now, Now: now, Answer: NoAnswer})
			require.False(t, eff.Changed)
		}
		require.True(t, eff.WakeAt.After(now))
		now = eff.WakeAt
	}
	require.Equal(t, t0.Add(8*time.Second), fencedAt, "fenced exactly at claim + TTL - margin")
	require.True(t, fencedAt.Before(t0.Add(10*time.Second)))
}

// A fenced node whose renewal then succeeds proves the lease never ended
// and serves again; a renewal whose proof is already past does not.
func TestRenewalAfterTheFenceUnfences(t *testing.T) {
	k := keeper(t)
	k.Step(Tick{Now: t0.Add(8 * time.Second)})
	require.Equal(t, Fenced, k.Status())
	eff := k.Step(RenewAnswered{SentAt: t0.Add(time.Second), Now: t0.Add(9 * time.Second), Answer: Renewed})
	require.Equal(t, Fenced, k.Status(), "a renewal sent at 1 s proves the lease only until 9 s")
	require.False(t, eff.Changed)
	eff = k.Step(RenewAnswered{SentAt: t0.Add(9 * time.Second), Now: t0.Add(9500 * time.Millisecond), Answer: Renewed})
	require.False(t, eff.Changed, "one renewal after the fence may be the store's last act for the lease")
	require.Equal(t, Fenced, k.Status())
	require.False(t, eff.Renew)
	require.Equal(t, t0.Add(10*time.Second), eff.WakeAt, "the confirming renewal goes out a confirm delay after the first success")
	eff = k.Step(Tick{Now: eff.WakeAt})
	require.True(t, eff.Renew)
	eff = k.Step(RenewAnswered{SentAt: t0.Add(10 * time.Second), Now: t0.Add(10100 * time.Millisecond), Answer: Renewed})
	require.True(t, eff.Changed)
	require.Equal(t, Valid, k.Status())
	require.Equal(t, t0.Add(18*time.Second), k.ValidUntil())
}

// Consul resuming from a stall longer than its session timer may answer a
// queued renewal and destroy the session right after (the timer's
// invalidation was already under way): the fenced node does not serve on
// that answer; its confirming renewal finds the lease gone. A failed
// renewal in between restarts the confirmation.
func TestARenewalRacingTheInvalidationDoesNotUnfence(t *testing.T) {
	k := keeper(t)
	k.Step(Tick{Now: t0.Add(8 * time.Second)})
	require.Equal(t, Fenced, k.Status())
	k.Step(RenewAnswered{SentAt: t0.Add(25 * time.Second), Now: t0.Add(25100 * time.Millisecond), Answer: Renewed})
	require.Equal(t, Fenced, k.Status())
	eff := k.Step(Tick{Now: t0.Add(26100 * time.Millisecond)})
	require.True(t, eff.Renew)
	k.Step(RenewAnswered{SentAt: t0.Add(26100 * time.Millisecond), Now: t0.Add(26200 * time.Millisecond), Answer: NoAnswer})
	k.Step(RenewAnswered{SentAt: t0.Add(27 * time.Second), Now: t0.Add(27100 * time.Millisecond), Answer: Renewed})
	require.Equal(t, Fenced, k.Status(), "not two successes in a row")
	eff = k.Step(RenewAnswered{SentAt: t0.Add(28100 * time.Millisecond), Now: t0.Add(28200 * time.Millisecond), Answer: Gone})
	require.True(t, eff.Changed)
	require.Equal(t, Ended, k.Status())
}

// The store saying the lease is gone, or a Stop, ends the lifecycle for good.
func TestGoneEndsTheLifecycle(t *testing.T) {
	k := keeper(t)
	eff := k.Step(RenewAnswered{SentAt: t0, Now: t0, Answer: Gone})
	require.True(t, eff.Changed)
	require.Equal(t, Ended, k.Status())
	require.Equal(t, Effects{}, k.Step(RenewAnswered{SentAt: t0, Now: t0, Answer: Renewed}))
	require.Equal(t, Ended, k.Status())

	k = keeper(t)
	require.True(t, k.Step(Stopped{Now: t0}).Changed)
	require.Equal(t, Ended, k.Status())
}

func TestConfigIsChecked(t *testing.T) {
	_, err := New(Config{}, t0)
	require.Error(t, err)
	_, err = New(Config{TTL: time.Second, Margin: time.Second}, t0)
	require.Error(t, err)
	_, err = New(Config{TTL: 10 * time.Second, RenewEvery: 9 * time.Second}, t0)
	require.Error(t, err)
}

// Random renewal delays, losses and store pauses against a model of the
// store (it applies a renewal somewhere between its send and its answer,
// may end the lease any time from TTL after the last applied renewal, and
// may then answer one renewal as renewed without applying it, as Consul
// does when a renewal races its session timer's invalidation):
// whenever the keeper says Valid, no node can yet see the lease as ended.
// Reference: PROTOCOL.md §10 (one owner at a time).
func TestValidNeverOverlapsAnEndedLease(t *testing.T) {
	for seed := uint64(1); seed <= 300; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		k := keeper(t)
		lastApplied := t0 // the claim
		var out *pending
		now := t0
		wake := t0
		ended, raced := false, false
		for step := 0; step < 400 && k.Status() != Ended; step++ {
			// The earliest instant another node could see the lease ended.
			if k.Status() == Valid {
				require.Truef(t, now.Before(lastApplied.Add(10*time.Second)),
					"seed %d: Valid at %s but the lease may have ended at %s", seed, now.Sub(t0), lastApplied.Add(10*time.Second).Sub(t0))
			}
			next := wake
			if out != nil && out.answer.Before(next) {
				next = out.answer
			}
			now = next
			if out != nil && !out.answer.After(now) {
				ans := out.ans
				applied := ans == Renewed
				if ans == Renewed && ended {
					// Consul may answer a renewal that races the
					// invalidation under way, and apply nothing; after
					// that the lease is gone.
					if !raced && rng.IntN(2) == 0 {
						raced, applied = true, false
					} else {
						ans, applied = Gone, false
					}
				}
				if applied {
					lastApplied = out.applied
				}
				eff := k.Step(RenewAnswered{SentAt: out.sent, Now: now, Answer: ans})
				out = nil
				wake = eff.WakeAt
				if eff.Renew {
					out = renewal(rng, now)
				}
				continue
			}
			if !ended && now.After(lastApplied.Add(10*time.Second+time.Duration(rng.Int64N(int64(10*time.Second))))) {
				ended = true
			}
			eff := k.Step(Tick{Now: now})
			wake = eff.WakeAt
			if eff.Renew {
				out = renewal(rng, now)
			}
		}
	}
}

// pending is one renewal in flight in the store model: applied (if
// Renewed) at some instant between its send and its answer.
type pending struct {
	sent, answer, applied time.Time
	ans                   Answer
}

func renewal(rng *rand.Rand, now time.Time) *pending {
	delay := time.Duration(rng.Int64N(int64(4 * time.Second)))
	r := &pending{sent: now, answer: now.Add(delay), applied: now.Add(time.Duration(rng.Int64N(int64(delay) + 1)))}
	switch rng.IntN(3) {
	case 0:
		r.ans = NoAnswer
	default:
		r.ans = Renewed
	}
	return r
}

// A renewal answered once the proof has lapsed needs the confirmation
// whether or not the fence Tick ran before the answer: the lapsed proof is
// a fence (the answer may be the store's last act for the lease, see
// TestARenewalRacingTheInvalidationDoesNotUnfence). Only an answer that
// comes strictly before the lapse is an ordinary renewal. The claim's proof
// lapses at 8 s (TTL 10 s, margin 2 s); the confirm delay is 1 s.
func TestALapsedProofNeedsTheConfirmationEvenBeforeTheFenceTick(t *testing.T) {
	cases := []struct {
		name        string
		fenceTick   bool          // the fence Tick at 8 s ran before the answer
		sent, now   time.Duration // the renewal's send time and its answer
		wantStatus  Status
		wantChanged bool // the answer itself changes the status
		wantConfirm bool // a second renewal is needed to serve
	}{
		{name: "answered before the lapse", sent: 7 * time.Second, now: 7900 * time.Millisecond,
			wantStatus: Valid},
		{name: "answered at the lapse, fence tick not run", sent: 7 * time.Second, now: 8 * time.Second,
			wantStatus: Fenced, wantChanged: true, wantConfirm: true},
		{name: "answered after the lapse, fence tick not run", sent: 7900 * time.Millisecond, now: 9 * time.Second,
			wantStatus: Fenced, wantChanged: true, wantConfirm: true},
		{name: "answered after the fence tick", fenceTick: true, sent: 7900 * time.Millisecond, now: 9 * time.Second,
			wantStatus: Fenced, wantConfirm: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k := keeper(t)
			if tc.fenceTick {
				require.True(t, k.Step(Tick{Now: t0.Add(8 * time.Second)}).Changed)
				require.Equal(t, Fenced, k.Status())
			}
			eff := k.Step(RenewAnswered{SentAt: t0.Add(tc.sent), Now: t0.Add(tc.now), Answer: Renewed})
			require.Equal(t, tc.wantStatus, k.Status())
			require.Equal(t, tc.wantChanged, eff.Changed)
			if !tc.wantConfirm {
				require.Equal(t, t0.Add(tc.sent+8*time.Second), k.ValidUntil())
				return
			}
			require.False(t, eff.Renew)
			confirmAt := t0.Add(tc.now + time.Second)
			require.Equal(t, confirmAt, eff.WakeAt, "the confirming renewal goes out a confirm delay after the answer")
			eff = k.Step(Tick{Now: confirmAt})
			require.True(t, eff.Renew)
			require.Equal(t, Fenced, k.Status())
			eff = k.Step(RenewAnswered{SentAt: confirmAt, Now: confirmAt.Add(100 * time.Millisecond), Answer: Renewed})
			require.True(t, eff.Changed)
			require.Equal(t, Valid, k.Status())
			require.Equal(t, confirmAt.Add(8*time.Second), k.ValidUntil())
		})
	}
}
