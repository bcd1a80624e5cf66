package spot

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
	pcluster "github.com/asynkron/protoactor-go/cluster"

	"github.com/roamactors/roam/messages"
)

// IdentityLookup is a Proto.Actor cluster.IdentityLookup backed by the
// Location Store: cluster.Request(identity, kind, msg) reaches the grain
// (identity, kind) as the Instance Spot GrainSpotID(kind, identity) of
// stable type kind, wherever it has moved.
//
// The mapping: the Spot ID is "<kind>/<identity>" and the stable type is
// the kind; the kind must be registered on roam as an Instance kind
// (Kind.Instance) on the nodes that may host it. Get resolves the Spot
// (route cache, then the store); a Missing grain is cold-activated with a
// GrainActivate first message that the framework answers itself, so the
// caller's own message is the first one the grain's code sees. After a
// move the old PID follows for MessageFollowDuration; when Proto.Actor
// meets a dead letter it calls RemovePid and asks again. Placement is
// roam's (the node's weight), not Proto.Actor's disthash, which would kill
// activations on every topology change.
type IdentityLookup struct {
	m atomic.Pointer[Manager]
}

var _ pcluster.IdentityLookup = (*IdentityLookup)(nil)

// NewIdentityLookup returns a lookup that answers once Attach has given it
// the node's Spot manager (extension.Start does).
func NewIdentityLookup() *IdentityLookup { return &IdentityLookup{} }

// Attach connects the lookup to the node's Spot manager.
func (l *IdentityLookup) Attach(m *Manager) { l.m.Store(m) }

// GrainSpotID is the Spot ID of the grain (kind, identity).
func GrainSpotID(kind, identity string) string { return kind + "/" + identity }

// Get returns the PID of the grain's current incarnation, activating it if
// Missing; nil when it cannot (Proto.Actor retries).
func (l *IdentityLookup) Get(ci *pcluster.ClusterIdentity) *actor.PID {
	m := l.m.Load()
	if m == nil {
		return nil
	}
	ctx, cancel := m.deadlineCtx(context.Background(), 0)
	defer cancel()
	pid, err := m.grainPID(ctx, ci.Kind, ci.Identity)
	if err != nil {
		m.log.Warn().Str("event", "grain_lookup_failed").Str("spot_id", GrainSpotID(ci.Kind, ci.Identity)).Err(err).Msg("the grain could not be resolved")
		return nil
	}
	return pid
}

// RemovePid forgets the cached route of a grain whose PID failed.
func (l *IdentityLookup) RemovePid(ci *pcluster.ClusterIdentity, _ *actor.PID) {
	if m := l.m.Load(); m != nil {
		m.cache.drop(GrainSpotID(ci.Kind, ci.Identity))
	}
}

// Setup is called by Proto.Actor's cluster at member start.
func (l *IdentityLookup) Setup(*pcluster.Cluster, []string, bool) {}

// Shutdown is called by Proto.Actor's cluster at member stop.
func (l *IdentityLookup) Shutdown() {}

// grainPID resolves a grain call's route the way every call by Spot ID
// does (takeRoute): a route being drained after a move is waited for, so a
// grain call never takes the new route while earlier calls of this node
// are still on the old one, ahead of its barrier. Proto.Actor sends on the
// PID right after Get returns, on the same goroutine; the use of a cached
// route ends when the PID is handed over, the closest roam sees of that
// send.
func (m *Manager) grainPID(ctx context.Context, kind, identity string) (*actor.PID, error) {
	id := GrainSpotID(kind, identity)
	for attempt := 0; attempt < 2; attempt++ {
		a, _, sent, err := m.takeRoute(ctx, id)
		if err != nil {
			sent()
			return nil, err
		}
		if a.ready() && !a.ended {
			pid := a.pid()
			sent()
			return pid, nil
		}
		sent()
		if attempt == 0 {
			if _, err := m.Request(id, &messages.GrainActivate{}).InstanceSpot(kind).Do(ctx); err != nil {
				return nil, err
			}
		}
	}
	return nil, fmt.Errorf("spot: grain %q did not become Ready", id)
}
