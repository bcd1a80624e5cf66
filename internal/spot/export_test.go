package spot

import (
	"context"

	"github.com/asynkron/protoactor-go/actor"
)

// SetNewIDForTest replaces the Create ID generator; the returned function
// restores it.
func SetNewIDForTest(f func() string) func() {
	old := newID
	newID = f
	return func() { newID = old }
}

// NewIDCalls counts the IDs Create issued.
func NewIDCalls() int64 { return newIDCalls.Load() }

// CachedRoutes is the number of routes m caches.
func CachedRoutes(m *Manager) int { return m.cache.len() }

// CachedOwner is the owner node RID of m's cached route to id, if cached.
func CachedOwner(m *Manager, id string) (string, bool) {
	a, ok, _ := m.cache.get(id)
	return a.v.Record.GetOwner().GetNodeRid(), ok
}

// GrainPID is what the IdentityLookup answers for the grain (kind,
// identity), within ctx.
func GrainPID(ctx context.Context, m *Manager, kind, identity string) (*actor.PID, error) {
	return m.grainPID(ctx, kind, identity)
}

// HintRoute marks m's cached route to id as followed, as a route hint
// does, without sending its barrier; drained ends the drain as the
// barrier's answer does (the route is dropped).
func HintRoute(m *Manager, id string) (hinted bool, drained func()) {
	_, _, hinted = m.cache.hinted(id)
	return hinted, func() { m.cache.drop(id) }
}

// Pending makes m answer a CommandConfirm for op as if it had sent that
// UserSpotCreate or UserSpotClose and waited for it, until done is
// called: a test that sends
// a hand-made command from m's node.
func (m *Manager) Pending(op string) (done func()) {
	m.pendingOps.Store(op, struct{}{})
	return func() { m.pendingOps.Delete(op) }
}

// Refused counts the commands m refused for their sender.
func (m *Manager) Refused() int64 { return m.refusedN.Load() }

// ConnectionEnded reports whether m saw its connection to address end and
// not made again since.
func ConnectionEnded(m *Manager, address string) bool {
	return m.d.ConnectionEnded(address)
}

// SayLeaving makes m's node tell the node at address that it is leaving,
// as its Stop does after its drain.
func SayLeaving(ctx context.Context, m *Manager, address string) error {
	return m.d.Leaving(ctx, address)
}

// RouteReadSharers is how many calls joined m's route read of id in
// progress (0: none in progress).
func RouteReadSharers(m *Manager, id string) int {
	m.resolvingMu.Lock()
	defer m.resolvingMu.Unlock()
	if r := m.resolving[id]; r != nil {
		return r.sharers
	}
	return 0
}
