package relocation

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/roamactors/roam/internal/ask"
	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// forwardedBound is the longest an owner legitimately takes over an
// operation another node forwarded to it (RelocateAt and the other *At
// calls), by this node's Config, which the nodes of a mesh share. A move
// may first wait for the object's arrival on the owner to end (the
// arriving move's restore deadline, then its target's cutover wait); then
// it runs within its own restore deadline, and Relocate waits for its
// commit to show for a cutover wait and one more restore timeout past
// that deadline (handoff.Config.CommitPatience). The owner's checks
// before a move starts (the asking node's membership, the target's
// descriptor) are store reads, allowed one capability timeout. An Actor
// deletion whose accepted turns take longer goes on at its owner; its
// asker hears DeadlineExceeded. With the defaults: 37 s.
func (c Config) forwardedBound() time.Duration {
	return 3*c.RestoreTimeout + 2*c.Handoff.CutoverWaitTimeout + c.CapabilityTimeout
}

// forwardedPatience is how long the asking node waits for the owner's
// answer: the owner's bound (which the request carries as its deadline)
// and one capability timeout for the answer to cross and for the two
// nodes' clocks to differ.
func (c Config) forwardedPatience() time.Duration {
	return c.forwardedBound() + c.CapabilityTimeout
}

// RelocateAt asks the relocation actor of the node at ownerAddress, the
// owner of key, to move it to targetRid (Relocate called on a node that is
// not the owner). The owner runs the move as if Relocate had been called
// there and answers with its outcome or its error, of the same class.
func (d *Driver) RelocateAt(ctx context.Context, ownerAddress string, key location.AuthorityKey, targetRid string) (Outcome, error) {
	r, err := d.askOwner(ctx, ownerAddress, key, &messages.RelocateRequest{TargetRid: targetRid})
	if err != nil {
		return Outcome{}, err
	}
	return outcomeOf(key, r), nil
}

// RelocateIfIdleAt is RelocateAt for RelocateIfIdle: the owner admits the
// move only if the object is idle at its seal (ErrBusy otherwise).
func (d *Driver) RelocateIfIdleAt(ctx context.Context, ownerAddress string, key location.AuthorityKey, targetRid string, window time.Duration) (Outcome, error) {
	r, err := d.askOwner(ctx, ownerAddress, key, &messages.RelocateRequest{TargetRid: targetRid, IdleOnly: true, IdleWindowMillis: window.Milliseconds()})
	if err != nil {
		return Outcome{}, err
	}
	return outcomeOf(key, r), nil
}

// outcomeOf is the Outcome an owner's RelocateReply reports.
func outcomeOf(key location.AuthorityKey, r *messages.RelocateReply) Outcome {
	return Outcome{
		RelocationID: r.GetRelocationId(), Key: key, From: r.GetFromRid(), To: r.GetToRid(),
		Bytes: r.GetBytes(), Chunks: r.GetChunks(), Pause: time.Duration(r.GetPauseNanos()),
	}
}

// DeleteActorAt asks the owner at ownerAddress to delete the Actor key
// (DeleteActor there).
func (d *Driver) DeleteActorAt(ctx context.Context, ownerAddress string, key location.AuthorityKey) (bool, error) {
	r, err := d.askOwner(ctx, ownerAddress, key, &messages.RelocateRequest{Action: messages.OwnerAction_OWNER_ACTION_DELETE_ACTOR})
	return r.GetDone(), err
}

// LeaveSpotAt asks the owner at ownerAddress to take the Actor key out of
// its User Spot (LeaveSpot there).
func (d *Driver) LeaveSpotAt(ctx context.Context, ownerAddress string, key location.AuthorityKey) error {
	_, err := d.askOwner(ctx, ownerAddress, key, &messages.RelocateRequest{Action: messages.OwnerAction_OWNER_ACTION_LEAVE_SPOT})
	return err
}

// JoinSpotAt asks the owner at ownerAddress to make the Actor key a member
// of the User Spot incarnation join (JoinSpot there).
func (d *Driver) JoinSpotAt(ctx context.Context, ownerAddress string, key location.AuthorityKey, join *messages.Membership) (Outcome, error) {
	r, err := d.askOwner(ctx, ownerAddress, key, &messages.RelocateRequest{Action: messages.OwnerAction_OWNER_ACTION_JOIN_SPOT, Join: join})
	if err != nil {
		return Outcome{}, err
	}
	return outcomeOf(key, r), nil
}

// askOwner sends req about key to the owner's relocation actor and waits
// for its answer, within ctx and forwardedPatience; a failure it answers
// comes back in the class the owner gave it. The wait ends as
// Unavailable, without waiting out its time, once the owner's lifecycle
// or this node's ends: an answer from either would never come.
func (d *Driver) askOwner(ctx context.Context, ownerAddress string, key location.AuthorityKey, req *messages.RelocateRequest) (*messages.RelocateReply, error) {
	if err := d.Usable(); err != nil {
		return nil, err
	}
	what := strings.ToLower(strings.TrimPrefix(req.GetAction().String(), "OWNER_ACTION_"))
	// The owner's lifecycle, to watch while waiting. One the store cannot
	// name now is asked all the same (its answer, or the time, ends it).
	owner, err := d.node.PeerAt(ctx, ownerAddress)
	switch {
	case errors.Is(err, meshnode.ErrNotMember):
		return nil, fmt.Errorf("%w: %s %s: no live node is at its owner's address %s", roamerr.ErrUnavailable, what, key, ownerAddress)
	case err != nil:
		owner = nil
	}
	wait := d.cfg.forwardedPatience()
	if dl, ok := ctx.Deadline(); ok {
		wait = min(machine.Until(d.clock, dl), wait)
	}
	if wait <= 0 {
		return nil, fmt.Errorf("%w: %s %s: %w", roamerr.ErrDeadlineExceeded, what, key, context.DeadlineExceeded)
	}
	req.Kind, req.Id = messages.AuthorityKind(key.Kind), key.ID
	// The owner stops by the bound, leaving the rest of the wait for its
	// answer to cross.
	req.Requester, req.DeadlineUnixMillis = d.selfRef(), d.clock.Now().Add(min(wait, d.cfg.forwardedBound())).UnixMilli()
	wctx, stop := d.whileLifecyclesLast(ctx, owner)
	defer stop()
	res, err := ask.Ask(wctx, d.sys, PID(ownerAddress), req, wait, ask.Question{Clock: d.clock, From: ownerAddress, What: "forwarded move",
		Accept: func(msg any) bool { _, ok := msg.(*messages.RelocateReply); return ok }})
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return nil, fmt.Errorf("%w: %s %s at its owner %s: %w", roamerr.ErrDeadlineExceeded, what, key, ownerAddress, ctx.Err())
	}
	if ended := context.Cause(wctx); err != nil && errors.Is(ended, errLifecycleEnded) {
		return nil, fmt.Errorf("%w: %s %s at its owner %s: %w", roamerr.ErrUnavailable, what, key, ownerAddress, ended)
	}
	if err != nil {
		if errors.Is(err, actor.ErrTimeout) {
			return nil, fmt.Errorf("%w: %s %s: its owner %s did not answer within %s", roamerr.ErrDeadlineExceeded, what, key, ownerAddress, wait)
		}
		return nil, fmt.Errorf("%w: %s %s at its owner %s: %v", roamerr.ErrUnavailable, what, key, ownerAddress, err)
	}
	if err := DeliveryError(res); err != nil {
		return nil, err
	}
	r, ok := res.(*messages.RelocateReply)
	if !ok {
		return nil, fmt.Errorf("%w: %s %s: its owner answered %T", roamerr.ErrUnavailable, what, key, res)
	}
	if r.GetCode() != "" {
		return nil, roamerr.FromCode(r.GetCode(), fmt.Sprintf("%s %s at its owner %s: %s", what, key, ownerAddress, r.GetDetail()))
	}
	return r, nil
}

// onRelocateRequest runs a move another node asked for: only a live node
// of the mesh at the address the request came from may ask, and only as a
// request (the answer goes to its future).
func (d *Driver) onRelocateRequest(c actor.Context, m *messages.RelocateRequest) {
	to := c.Sender()
	if to == nil || !strings.HasPrefix(to.Id, "future") {
		d.refused("relocate request", "", "not sent as a request")
		return
	}
	req := m.GetRequester()
	k := location.Kind(m.GetKind())
	switch {
	case m.GetAction() == messages.OwnerAction_OWNER_ACTION_RELOCATE && !Movable(k):
		d.sys.Root.Send(to, &messages.RelocateReply{Code: roamerr.CodeInvalidOperation, Detail: "an Entry Spot does not move"})
		return
	case m.GetAction() != messages.OwnerAction_OWNER_ACTION_RELOCATE && k != location.KindActor:
		d.sys.Root.Send(to, &messages.RelocateReply{Code: roamerr.CodeInvalidOperation, Detail: "only Actors are deleted, join or leave a Spot this way"})
		return
	}
	go func() {
		deadline := time.UnixMilli(m.GetDeadlineUnixMillis())
		if limit := d.clock.Now().Add(d.cfg.forwardedBound()); m.GetDeadlineUnixMillis() <= 0 || deadline.After(limit) {
			deadline = limit
		}
		ctx, cancel := machine.WithDeadline(context.Background(), d.clock, deadline)
		defer cancel()
		reply := &messages.RelocateReply{}
		if err := d.node.VerifyPeer(ctx, req.GetNodeRid(), req.GetNodeGeneration(), to.Address); err != nil {
			d.refused("relocate request", to.Address, err.Error())
			reply.Code, reply.Detail = roamerr.CodeUnavailable, "the owner cannot check the asking node in the Location Store now"
			if errors.Is(err, meshnode.ErrNotMember) {
				reply.Code, reply.Detail = roamerr.CodePermissionDenied, "the asking node is not a live member of this mesh at its address"
			}
			d.sys.Root.Send(to, reply)
			return
		}
		key := location.Key(k, m.GetId())
		var err error
		switch m.GetAction() {
		case messages.OwnerAction_OWNER_ACTION_DELETE_ACTOR:
			reply.Done, err = d.DeleteActor(ctx, key)
		case messages.OwnerAction_OWNER_ACTION_LEAVE_SPOT:
			err = d.LeaveSpot(ctx, key)
		default:
			var out Outcome
			switch {
			case m.GetAction() == messages.OwnerAction_OWNER_ACTION_JOIN_SPOT:
				out, err = d.JoinSpot(ctx, key, m.GetJoin())
			case m.GetIdleOnly():
				out, err = d.RelocateIfIdle(ctx, key, m.GetTargetRid(), time.Duration(max(0, m.GetIdleWindowMillis()))*time.Millisecond)
			default:
				out, err = d.Relocate(ctx, key, m.GetTargetRid())
			}
			reply.RelocationId, reply.FromRid, reply.ToRid = out.RelocationID, out.From, out.To
			reply.Bytes, reply.Chunks, reply.PauseNanos = out.Bytes, out.Chunks, int64(out.Pause)
		}
		if err != nil {
			reply = &messages.RelocateReply{Code: roamerr.Code(err), Detail: err.Error()}
		}
		d.sys.Root.Send(to, reply)
	}()
}

// errLifecycleEnded: the lifecycle of the node asked, or of this node,
// ended while a forwarded operation waited for its answer.
var errLifecycleEnded = errors.New("a node lifecycle ended")

// untilStopped is a context that ends when this node stops: a question
// whose timeout runs on the node's clock (ask.Ask) must not outlive its
// node, whose clock may never move again (a stopped node in logical time
// left a capability query waiting for good). cancel ends it earlier.
func (d *Driver) untilStopped() (context.Context, context.CancelFunc) {
	return machine.UntilClosed(d.node.Stopped())
}

// whileLifecyclesLast is ctx, ended with a cause wrapping
// errLifecycleEnded once this node's lifecycle ends (its lease lost, or
// the node stopped) or the store shows that owner's has: its descriptor
// gone, revoked, or another lifecycle's. The store is read once per
// ownerLookEvery on this node's clock; a nil owner is not looked at.
// stop ends the watch.
func (d *Driver) whileLifecyclesLast(ctx context.Context, owner *location.NodeDescriptor) (wctx context.Context, stop func()) {
	wctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			var look <-chan time.Time
			var t machine.Timer
			if owner != nil {
				look, t = machine.NewTimer(d.clock, ownerLookEvery(owner))
			}
			select {
			case <-wctx.Done():
			case <-d.node.Stopped():
				cancel(fmt.Errorf("%w: node %s stopped", errLifecycleEnded, d.desc.GetNodeRid()))
			case <-d.node.LeaseLost():
				cancel(fmt.Errorf("%w: the owner lease of node %s ended", errLifecycleEnded, d.desc.GetNodeRid()))
			case <-look:
				if gone := d.lifecycleGone(wctx, owner); gone != nil {
					cancel(gone)
				}
			}
			if t != nil {
				t.Stop()
			}
			if wctx.Err() != nil {
				return
			}
		}
	}()
	return wctx, func() { cancel(nil); <-done }
}

// ownerLookEvery is how often a forwarded operation's asker reads its
// owner's descriptor: a quarter of the owner's lease TTL, between 250 ms
// and 1 s (the pace at which the nodes sweep for ended owners).
func ownerLookEvery(owner *location.NodeDescriptor) time.Duration {
	return min(max(time.Duration(owner.GetLeaseTtlSeconds())*time.Second/4, 250*time.Millisecond), time.Second)
}

// lifecycleGone reports, wrapping errLifecycleEnded, that the store no
// longer holds owner's lifecycle; nil while it does, or cannot tell.
func (d *Driver) lifecycleGone(ctx context.Context, owner *location.NodeDescriptor) error {
	n, err := d.store.ReadNode(ctx, location.NodeKeyOf(owner))
	switch {
	case errors.Is(err, location.ErrNotFound), errors.Is(err, location.ErrLeaseRevoked):
		return fmt.Errorf("%w: node %s, the owner, is gone from the Location Store", errLifecycleEnded, owner.GetNodeRid())
	case err != nil:
		return nil
	case n.Node.GetNodeGeneration() != owner.GetNodeGeneration() || n.Node.GetLeaseId() != owner.GetLeaseId():
		return fmt.Errorf("%w: node %s, the owner, started a later lifecycle", errLifecycleEnded, owner.GetNodeRid())
	}
	return nil
}
