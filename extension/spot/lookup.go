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
	pid, err := m.grainPID(ci.Kind, ci.Identity)
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

func (m *Manager) grainPID(kind, identity string) (*actor.PID, error) {
	id := GrainSpotID(kind, identity)
	ctx, cancel := m.deadlineCtx(context.Background(), 0)
	defer cancel()
	for attempt := 0; attempt < 2; attempt++ {
		a, ok, _ := m.cache.get(id)
		if !ok {
			var err error
			if a, err = m.readAuthority(ctx, id); err != nil {
				return nil, err
			}
			m.cache.put(id, a)
		}
		if a.ready() && !a.ended {
			return a.pid(), nil
		}
		if attempt == 0 {
			if _, err := m.Request(id, &messages.GrainActivate{}).InstanceSpot(kind).Do(ctx); err != nil {
				return nil, err
			}
		}
	}
	return nil, fmt.Errorf("spot: grain %q did not become Ready", id)
}
