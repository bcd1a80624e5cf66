package spot

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	pcluster "github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
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
//
// Every other kind — registered with Proto.Actor's cluster.WithKinds and
// not with roam — is passed to the inner lookup (Proto.Actor's disthash by
// default) and works exactly as it would without roam. A kind is roam's
// if this node registered it with roam or a live node of the store lists
// it among its Instance types (the node's shared list of the nodes, read at
// most once a second).
type IdentityLookup struct {
	m     atomic.Pointer[Manager]
	inner pcluster.IdentityLookup
	// local reports the kinds this node registers with roam, known before
	// the Spot manager is attached; nil for none.
	local func(kind string) bool

	clashLogged atomic.Bool

	mu           sync.Mutex
	clusterKinds map[string]bool   // the kinds of this node's Proto.Actor cluster (Setup)
	cluster      *pcluster.Cluster // this node's Proto.Actor cluster (Setup)
	remote       map[string]bool   // Instance types of the mesh's live nodes, as last read
}

var _ pcluster.IdentityLookup = (*IdentityLookup)(nil)

// NewIdentityLookup returns a lookup that answers roam's kinds once Attach
// has given it the node's Spot manager, and passes every other kind to
// inner; nil inner means Proto.Actor's disthash. local reports the kinds
// this node registers with roam (nil: none known before Attach).
func NewIdentityLookup(inner pcluster.IdentityLookup, local func(kind string) bool) *IdentityLookup {
	if inner == nil {
		inner = disthash.New()
	}
	return &IdentityLookup{inner: inner, local: local}
}

// Attach connects the lookup to the node's Spot manager.
func (l *IdentityLookup) Attach(m *Manager) { l.m.Store(m) }

// relocatable reports whether kind is one of roam's.
func (l *IdentityLookup) relocatable(kind string) bool {
	if l.local != nil && l.local(kind) {
		return true
	}
	m := l.m.Load()
	if m == nil {
		return false
	}
	if k, ok := m.d.Kind(kind); ok && k.Instance {
		return true
	}
	l.mu.Lock()
	own := l.clusterKinds[kind]
	l.mu.Unlock()
	if own {
		// This node's Proto.Actor kind: it stays Proto.Actor's even if
		// another node hosts a roam kind of that name (logged once).
		if l.remoteKinds(m)[kind] && l.clashLogged.CompareAndSwap(false, true) {
			m.log.Warn().Str("event", "kind_name_clash").Str("kind", kind).
				Msg("a kind registered with this node's Proto.Actor cluster has the name of a relocatable kind on another node; this node resolves it as Proto.Actor's")
		}
		return false
	}
	return l.remoteKinds(m)[kind]
}

// remoteKinds returns the Instance types of the mesh's live nodes, from
// the node's shared list of the nodes (at most one a second); the last
// answer stays in use while the store does not answer.
func (l *IdentityLookup) remoteKinds(m *Manager) map[string]bool {
	ctx, cancel := machine.WithTimeout(context.Background(), m.clock, 2*time.Second)
	nodes, err := m.d.Node().LiveNodes(ctx, time.Second)
	cancel()
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		return l.remote
	}
	kinds := map[string]bool{}
	for _, n := range nodes {
		if n.GetMesh() == m.desc.GetMesh() {
			for _, t := range n.GetInstanceTypes() {
				kinds[t] = true
			}
		}
	}
	l.remote = kinds
	return kinds
}

// GrainSpotID is the Spot ID of the grain (kind, identity).
func GrainSpotID(kind, identity string) string { return kind + "/" + identity }

// Get returns the PID of the grain's current incarnation, activating it if
// Missing. When roam cannot resolve it, a PID that answers the call with
// roam's typed failure (failedLookup); nil only before roam started here
// (Proto.Actor retries).
func (l *IdentityLookup) Get(ci *pcluster.ClusterIdentity) *actor.PID {
	if !l.relocatable(ci.Kind) {
		return l.inner.Get(ci)
	}
	m := l.m.Load()
	if m == nil {
		return nil
	}
	ctx, cancel := m.deadlineCtx(context.Background(), 0)
	defer cancel()
	pid, err := m.grainPID(ctx, ci.Kind, ci.Identity)
	if err != nil {
		m.log.Warn().Str("event", "grain_lookup_failed").Str("spot_id", GrainSpotID(ci.Kind, ci.Identity)).Err(err).Msg("the grain could not be resolved")
		return l.failed(m, ci, err)
	}
	return pid
}

// failed returns the PID of a failedLookup for the grain ci and err.
func (l *IdentityLookup) failed(m *Manager, ci *pcluster.ClusterIdentity, err error) *actor.PID {
	l.mu.Lock()
	pc := l.cluster
	l.mu.Unlock()
	f := &failedLookup{sys: m.sys, pc: pc, ci: ci, err: err}
	pid, ok := m.sys.ProcessRegistry.Add(f, "roam/grain-lookup-failed/"+m.sys.ProcessRegistry.NextId())
	if !ok {
		return nil // an ID NextId gave twice: never
	}
	f.pid = pid
	f.expiry = machine.Real.AfterFunc(failedLookupFor, f.remove) // clean-up, not protocol
	return pid
}

// failedLookupFor bounds how long a failedLookup waits for the call it
// answers: Proto.Actor sends it right after Get returns, on the same
// goroutine, so only a PID asked for and never used waits this long.
const failedLookupFor = time.Minute

// failedLookup answers the call a grain lookup failed for with roam's
// typed failure: a grain request as its generated client reads an error
// (failure.Answer). Get cannot return an error, and a nil PID makes
// Proto.Actor ask again at once, three times, and end the call with an
// untyped "have reached max retries". It answers one call, then leaves
// the registry and Proto.Actor's PID cache, so that the next call looks
// the grain up again; a message that still comes to it is a dead letter.
type failedLookup struct {
	sys    *actor.ActorSystem
	pc     *pcluster.Cluster // nil before Setup
	ci     *pcluster.ClusterIdentity
	err    error
	pid    *actor.PID
	expiry machine.Timer
	used   atomic.Bool
}

func (f *failedLookup) SendUserMessage(pid *actor.PID, message any) {
	if f.used.Swap(true) {
		f.sys.DeadLetter.SendUserMessage(pid, message)
		return
	}
	f.remove()
	_, msg, sender := actor.UnwrapEnvelope(message)
	relocation.RespondFailure(f.sys, sender, msg, GrainSpotID(f.ci.Kind, f.ci.Identity), f.err)
}

func (f *failedLookup) SendSystemMessage(pid *actor.PID, message any) {
	f.sys.DeadLetter.SendSystemMessage(pid, message)
}

func (f *failedLookup) Stop(*actor.PID) { f.remove() }

func (f *failedLookup) remove() {
	if f.expiry != nil {
		f.expiry.Stop()
	}
	f.sys.ProcessRegistry.Remove(f.pid)
	if f.pc != nil {
		f.pc.PidCache.RemoveByValue(f.ci.Identity, f.ci.Kind, f.pid)
	}
}

// RemovePid forgets the cached route of a grain whose PID failed.
func (l *IdentityLookup) RemovePid(ci *pcluster.ClusterIdentity, pid *actor.PID) {
	if !l.relocatable(ci.Kind) {
		l.inner.RemovePid(ci, pid)
		return
	}
	if m := l.m.Load(); m != nil {
		m.cache.drop(GrainSpotID(ci.Kind, ci.Identity))
	}
}

// Setup is called by Proto.Actor's cluster at member start; the inner
// lookup is set up with the cluster's own kinds.
func (l *IdentityLookup) Setup(c *pcluster.Cluster, kinds []string, isClient bool) {
	l.mu.Lock()
	l.cluster = c
	l.clusterKinds = map[string]bool{}
	for _, k := range kinds {
		l.clusterKinds[k] = true
	}
	l.mu.Unlock()
	l.inner.Setup(c, kinds, isClient)
}

// Shutdown is called by Proto.Actor's cluster at member stop.
func (l *IdentityLookup) Shutdown() { l.inner.Shutdown() }

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
		a, _, use, err := m.takeRoute(ctx, id, nil)
		if err != nil {
			use.sent()
			return nil, err
		}
		if a.ready() && !a.ended {
			pid := a.pid()
			use.sent()
			return pid, nil
		}
		use.sent()
		if attempt == 0 {
			if _, err := m.Request(id, &messages.GrainActivate{}).InstanceSpot(kind).Do(ctx); err != nil {
				return nil, err
			}
		}
	}
	return nil, fmt.Errorf("%w: grain %q did not become Ready", roamerr.ErrUnavailable, id)
}
