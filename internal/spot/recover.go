package spot

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/roamactors/roam/internal/activation"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Sweep is what one RecoverEnded pass found.
type Sweep struct {
	// Recovered: objects this node brought back (from their checkpoints,
	// or from their producers where the kind carries no state).
	Recovered int
	// Waiting: objects of ended (or ending) owners left for a later pass:
	// their owner is seen gone for less than a lease TTL, another live
	// node is the one to recover them, or their recovery failed here.
	Waiting int
	// ForOperator: objects of ended owners that wait for an operator's
	// ReleaseEnded by their kind's policy (RecoverByOperator, or state
	// without checkpoints), of kinds this node hosts. Every node that
	// hosts the kind counts them.
	ForOperator []location.AuthorityKey
}

// RecoverEnded brings back, without waiting for a call, the objects whose
// owner ended (docs/FAULTS.md, "Checkpoints and recovery"): Instance
// Spots of kinds that checkpoint, and Actors and User Spots of every kind
// whose policy recovers them (activation.Kind.EndedPolicy). Each is
// recovered by one live node, the first of its candidates in the same
// weighted order a cold activation uses — an Actor that is a member of a
// User Spot by its Spot's ID, so a Spot and its members come back on one
// node — so the recoveries of a lost node spread over the live ones by
// weight. Others leave it; a node that ends before it recovered its share
// leaves it to the next pass, in which the order no longer names it. A
// recovery racing another node's (or a call's activation, or an
// operator's release) loses the store's compare-and-set and leaves the
// object to it.
func (m *Manager) RecoverEnded(ctx context.Context) (Sweep, error) {
	var sw Sweep
	nodes, err := m.store.ListNodes(ctx, m.desc.GetMesh())
	if err != nil {
		return sw, storeError("list nodes", err)
	}
	type ownerState struct {
		alive bool
		err   error
	}
	owners := map[string]ownerState{} // one look per owner lifecycle and pass
	ownerOf := func(o *messages.Owner) (bool, error) {
		id := fmt.Sprintf("%s/%d/%s", o.GetNodeRid(), o.GetNodeGeneration(), o.GetLeaseId())
		if s, ok := owners[id]; ok {
			return s.alive, s.err
		}
		_, alive, err := m.ownerAddress(ctx, o)
		owners[id] = ownerState{alive, err}
		return alive, err
	}
	// spotState says of v, a member Actor, where its User Spot stands: it
	// waits for an operator (the member waits with it), it serves on a live
	// node (the member is recovered there, so a Spot and its members stay
	// together even when a recovery fell to another candidate), it is an
	// ended owner's still (recovered first; the member follows it), or that
	// is not known this pass (the Spot's record unreadable, its owner still
	// ending). One look per Spot and pass.
	type spotState struct {
		waits, unsure, first bool
		at                   string // the Spot's live owner's node RID
	}
	spots := map[string]spotState{}
	// hostsJudge: per stable type, what the live nodes hosting it say of an
	// ended owner's Spot of it (ReleasableEnded), asked once a pass.
	hostsJudge := map[string]error{}
	spotOf := func(v location.Versioned) spotState {
		ms := v.Record.GetMembership()
		if v.Key.Kind != location.KindActor || ms.GetSpotId() == "" || meshnode.IsEntrySpotID(ms.GetSpotId()) {
			return spotState{}
		}
		st, ok := spots[ms.GetSpotId()]
		if !ok {
			sv, err := m.store.Read(ctx, location.Key(location.KindUserSpot, ms.GetSpotId()))
			switch {
			case errors.Is(err, location.ErrNotFound):
			case err != nil:
				st.unsure = true
			case sv.Record.GetObjectGeneration() == ms.GetSpotGeneration():
				alive, aerr := ownerOf(sv.Record.GetOwner())
				switch {
				case aerr != nil:
					st.unsure = true
				case alive:
					st.at = sv.Record.GetOwner().GetNodeRid()
				case m.kindOf(sv.Record.GetStableType()).EndedPolicy() == activation.EndedOperator:
					st.waits = true
				case len(candidates(nodes, sv.Record.GetStableType(), false, "")) == 0:
					// Hosted nowhere: its members do not wait for it.
				case m.kindOf(sv.Record.GetStableType()).EndedPolicy() != activation.EndedNotHosted:
					st.first = true // recovered first; this node hosts its kind
				default:
					// Judged by the live nodes that host its kind: recovered
					// first where one recovers such Spots by itself, else it
					// waits for an operator there, and its members with it.
					err, asked := hostsJudge[sv.Record.GetStableType()]
					if !asked {
						err = m.d.ReleasableEnded(ctx, sv.Record.GetStableType(), sv.Key)
						hostsJudge[sv.Record.GetStableType()] = err
					}
					switch {
					case err == nil:
						st.waits = true
					case errors.Is(err, roamerr.ErrInvalidOperation):
						st.first = true
					default:
						st.unsure = true
					}
				}
			}
			spots[ms.GetSpotId()] = st
		}
		return st
	}
	var errs []error
	seen := map[location.AuthorityKey]int{}
	for _, kind := range []location.Kind{location.KindInstanceSpot, location.KindUserSpot, location.KindActor} {
		after := ""
		for {
			page, err := m.store.List(ctx, kind, location.PageRequest{Size: location.MaxPageSize, After: after})
			if err != nil {
				return sw, storeError("scan", err)
			}
			for _, v := range page.Items {
				if !recoverableRecord(v) {
					continue
				}
				k := m.kindOf(v.Record.GetStableType())
				policy := k.EndedPolicy()
				if policy == activation.EndedNotHosted || (kind == location.KindInstanceSpot && policy != activation.EndedFromCheckpoint) {
					// An Instance Spot of a stateless kind comes back on
					// its next call, as it always did.
					continue
				}
				alive, err := ownerOf(v.Record.GetOwner())
				switch {
				case errors.Is(err, roamerr.ErrOwnerEnding):
					sw.Waiting++
					continue
				case err != nil:
					errs = append(errs, err)
					continue
				case alive:
					continue
				}
				st := spotOf(v)
				if st.unsure || st.first {
					sw.Waiting++
					continue
				}
				if policy == activation.EndedOperator || st.waits {
					// A member of a Spot that waits for an operator waits
					// with it: ReleaseEnded of the Spot releases its
					// members, which it could not do to a member serving
					// on a live node.
					sw.ForOperator = append(sw.ForOperator, v.Key)
					continue
				}
				c := candidates(nodes, v.Record.GetStableType(), kind == location.KindInstanceSpot, recoveryPlace(v))
				if st.at != "" {
					if !slices.ContainsFunc(nodes, func(n location.VersionedNode) bool { return n.Node.GetNodeRid() == st.at }) {
						// The Spot's live owner started after this pass
						// listed the nodes (a lifecycle that recovered the
						// Spot meanwhile): recovered here, the member would
						// land away from its Spot, which a SpotWide Spot
						// never undoes. The next pass lists it.
						sw.Waiting++
						continue
					}
					c = spotNodeFirst(c, st.at)
				}
				if !m.recoversNow(c, v.Key, seen) {
					sw.Waiting++ // another live node's share
					continue
				}
				if err := m.recoverEndedOne(ctx, v, policy); err != nil {
					// Under way (an earlier pass's takeover, a write being
					// settled): neither recovered nor failed; it waits.
					sw.Waiting++
					if !errors.Is(err, roamerr.ErrConflict) && !errors.Is(err, relocation.ErrTakeOverUnderWay) {
						errs = append(errs, err)
					}
					continue
				}
				sw.Recovered++
			}
			if page.Next == "" {
				break
			}
			after = page.Next
		}
	}
	if len(errs) == 0 {
		m.reportForOperator(sw.ForOperator)
	}
	m.recovering.Lock()
	m.recovering.passes = seen // what waits no more is forgotten
	m.recovering.Unlock()
	return sw, oneFailure(errs)
}

// recoversNow reports whether this node recovers key now: it is the first
// of the key's candidates, or the i-th one once the object has waited
// recoverAfter passes per node ahead of it (the first could not take it:
// no room, or it ends without saying so). seen gathers this pass's counts.
func (m *Manager) recoversNow(c []location.VersionedNode, key location.AuthorityKey, seen map[location.AuthorityKey]int) bool {
	m.recovering.Lock()
	passes := m.recovering.passes[key] + 1
	m.recovering.Unlock()
	seen[key] = passes
	for i, n := range c {
		if n.Node.GetNodeRid() == m.desc.GetNodeRid() {
			return passes > i*recoverAfter
		}
	}
	return false
}

// spotNodeFirst puts the candidate rid — a member's User Spot's node —
// first: the member is recovered with its Spot, unless that node cannot
// take it (then the others in turn, recoversNow). A node that is no
// candidate (not serving, or not hosting the member's kind) is not added.
func spotNodeFirst(c []location.VersionedNode, rid string) []location.VersionedNode {
	for i, n := range c {
		if n.Node.GetNodeRid() == rid {
			out := append([]location.VersionedNode{n}, c[:i]...)
			return append(out, c[i+1:]...)
		}
	}
	return c
}

// recoverAfter is how many passes an ended owner's object waits for each
// candidate ahead of a node before that node recovers it itself.
const recoverAfter = 3

// reportForOperator publishes a complete pass's count of the objects that
// wait for an operator (metric roam.recovery.waiting_for_operator) and
// logs objects_waiting_for_operator whenever it changes: waiting for an
// operator is a policy a kind chooses, never a silent outcome
// (docs/FAULTS.md).
func (m *Manager) reportForOperator(keys []location.AuthorityKey) {
	n := int64(len(keys))
	if m.met.forOperator.Swap(n) == n {
		return
	}
	if n == 0 {
		m.log.Info().Str("event", "objects_waiting_for_operator").Int64("count", 0).Msg("no object of an ended owner waits for an operator any more")
		return
	}
	ids := make([]string, 0, min(len(keys), 10))
	for _, k := range keys[:min(len(keys), 10)] {
		ids = append(ids, k.String())
	}
	m.log.Warn().Str("event", "objects_waiting_for_operator").Int64("count", n).Strs("first", ids).
		Msg("objects of ended owners are not served: their kinds wait for an operator; ReleaseEnded accepts each loss (roamctl ended lists them)")
}

// ForOperator is how many objects of ended owners wait for an operator,
// as this node's last complete recovery pass counted them.
func (m *Manager) ForOperator() int { return int(m.met.forOperator.Load()) }

// recoverableRecord reports whether v may be an ended owner's object that
// a live node brings back without waiting for a call: Ready, with no
// activation in progress; an Instance Spot only of a kind that preserves
// state (the others reactivate on their next call).
func recoverableRecord(v location.Versioned) bool {
	if v.Key.Kind == location.KindInstanceSpot {
		return activation.RecoverableFromCheckpoint(v)
	}
	return v.Record.GetState() == messages.LifecycleState_LIFECYCLE_STATE_READY && v.Record.GetActivationRecovery() == nil
}

// recoveryPlace is the ID whose candidates order decides who recovers v:
// a member Actor's User Spot's, else its own.
func recoveryPlace(v location.Versioned) string {
	if ms := v.Record.GetMembership(); v.Key.Kind == location.KindActor && ms.GetSpotId() != "" && !meshnode.IsEntrySpotID(ms.GetSpotId()) {
		return ms.GetSpotId()
	}
	return v.Key.ID
}

// recoverEndedOne recovers one ended owner's object on this node.
func (m *Manager) recoverEndedOne(ctx context.Context, v location.Versioned, policy activation.Ended) error {
	if v.Key.Kind == location.KindInstanceSpot {
		return m.recoverOne(ctx, v)
	}
	if err := m.d.TakeOver(ctx, v, policy == activation.EndedFromCheckpoint); err != nil {
		return err
	}
	if v.Key.Kind == location.KindUserSpot {
		m.cache.drop(v.Key.ID)
	}
	m.log.Warn().Str("event", "object_recovered").Str("object_id", v.Key.ID).Str("object_kind", location.KindName(v.Key.Kind)).
		Str("stable_type", v.Record.GetStableType()).Str("owner_node_rid", v.Record.GetOwner().GetNodeRid()).Str("recovery", policy.String()).
		Msg("an ended owner's object is taken over by this node; it serves again once its checkpoint is restored")
	return nil
}
