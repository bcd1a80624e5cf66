package activation

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

// t0 is the scripted clock's start; no test reads the wall clock.
var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

var (
	self  = &messages.Owner{Mesh: "default", NodeRid: "n1", NodeGeneration: 1, LeaseId: "lease-n1"}
	other = &messages.Owner{Mesh: "default", NodeRid: "n2", NodeGeneration: 4, LeaseId: "lease-n2"}
	cfg   = DefaultConfig(self)

	cartKey   = location.Key(location.KindInstanceSpot, "cart-1")
	stateless = Kind{Registered: true}
	preserved = Kind{Registered: true, PreservesState: true}

	errStore = errors.New("store: connection refused")
)

const (
	op       = "op-current"
	storedOp = "op-stored"
)

// at is the scripted time t0+d.
func at(d time.Duration) time.Time { return t0.Add(d) }

// deadline is the activation's deadline in these tests: 5 s after t0.
var deadline = at(5 * time.Second)

func envelope() *messages.SpotActivation {
	return &messages.SpotActivation{
		OperationId: op, RouteKind: 2, SpotId: cartKey.ID, StableType: "cart",
		TargetNodeRid: self.GetNodeRid(), TargetNodeGeneration: self.GetNodeGeneration(),
		DeadlineUnixNanos: deadline.UnixNano(), First: &messages.Envelope{},
	}
}

func start(kind Kind) Start {
	return Start{Envelope: envelope(), First: "first", Kind: kind, Now: t0}
}

// names lists the effects' type names, for order assertions.
func names(effects []Effect) []string {
	out := []string{}
	for _, e := range effects {
		out = append(out, reflect.TypeOf(e).Name())
	}
	return out
}

func find[T Effect](t *testing.T, effects []Effect) T {
	t.Helper()
	for _, e := range effects {
		if v, ok := e.(T); ok {
			return v
		}
	}
	var zero T
	t.Fatalf("no %T in %v", zero, names(effects))
	return zero
}

func logEvents(effects []Effect) []string {
	out := []string{}
	for _, e := range effects {
		if l, ok := e.(Log); ok {
			out = append(out, l.Event)
		}
	}
	return out
}

// machine is any of the package's machines.
type machine interface {
	Step(Event) []Effect
}

// step feeds ev to m and checks the effects' types, in order.
func step(t *testing.T, m machine, ev Event, want ...string) []Effect {
	t.Helper()
	effects := m.Step(ev)
	if want == nil {
		want = []string{}
	}
	require.Equal(t, want, names(effects), "effects of %T", ev)
	return effects
}

// missing is an authority read that found no record.
func missing(now time.Time) AuthorityRead {
	return AuthorityRead{Authority: Authority{Versioned: location.Versioned{Key: cartKey}}, Now: now}
}

// record is a record of cart-1 at version v.
func record(v location.StoreVersion, state messages.LifecycleState, owner *messages.Owner, rr *messages.ActivationRecovery) location.Versioned {
	return location.Versioned{Key: cartKey, Version: v, Record: &location.Record{
		ObjectGeneration: 40, AuthorityOwnerGeneration: 2, State: state, Owner: owner, StableType: "cart",
		SpotKind: messages.SpotKind_SPOT_KIND_INSTANCE, ActivationRecovery: rr,
	}}
}

const (
	creating = messages.LifecycleState_LIFECYCLE_STATE_CREATING
	ready    = messages.LifecycleState_LIFECYCLE_STATE_READY
	closing  = messages.LifecycleState_LIFECYCLE_STATE_CLOSING
)

// storedRef is the recovery root an interrupted activation left.
var storedRef = location.RootRef{Key: "activation-" + storedOp, SHA256: [32]byte{1, 2, 3}, Size: 99}

func receipt(deadline time.Time) *messages.ActivationRecovery {
	rr := &messages.ActivationRecovery{RecoveryKey: storedRef.Key, RootSha256: storedRef.SHA256[:], RootSize: storedRef.Size,
		OperationId: storedOp, ReservationFence: 40}
	if !deadline.IsZero() {
		rr.DeadlineUnixNanos = deadline.UnixNano()
	}
	return rr
}

// toReserve drives a cold activation of a Missing Spot up to its
// reservation and returns the machine and the Reserve effect.
func toReserve(t *testing.T) (*Activation, Reserve) {
	t.Helper()
	a, effects := NewActivation(cfg, start(stateless))
	require.Equal(t, []string{"StartTimer", "LockKey"}, names(effects))
	step(t, a, KeyLocked{Now: t0}, "ReadAuthority")
	step(t, a, missing(at(time.Millisecond)), "AdmitCapacity")
	require.Equal(t, Admitting, a.Phase())
	step(t, a, CapacityAdmitted{}, "PutRoot")
	effects = step(t, a, RootPut{Ref: location.RootRef{Key: "activation-" + op, SHA256: [32]byte{9}, Size: 10}}, "Reserve")
	require.Equal(t, Reserving, a.Phase())
	return a, effects[0].(Reserve)
}

// failedWith checks the failure tail of a SpotActivation and returns its
// error: measured, answered to the sender, logged, finished.
func failedWith(t *testing.T, a *Activation, effects []Effect) error {
	t.Helper()
	require.Equal(t, Failed, a.Phase())
	require.True(t, a.Finished())
	n := len(effects)
	require.GreaterOrEqual(t, n, 4)
	require.Equal(t, []string{"Measure", "RespondFailure", "Log", "Finish"}, names(effects[n-4:]))
	require.Equal(t, "activation_failed", effects[n-2].(Log).Event)
	err := effects[n-1].(Finish).Err
	require.Error(t, err)
	require.Equal(t, err, effects[n-3].(RespondFailure).Err)
	require.Equal(t, err, a.Err())
	return err
}
