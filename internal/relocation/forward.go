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

// maxForwardedMove bounds a forwarded move whose requester sent no
// deadline, or a later one.
const maxForwardedMove = 10 * time.Minute

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
// for its answer, within ctx and maxForwardedMove; a failure it answers
// comes back in the class the owner gave it.
func (d *Driver) askOwner(ctx context.Context, ownerAddress string, key location.AuthorityKey, req *messages.RelocateRequest) (*messages.RelocateReply, error) {
	if err := d.Usable(); err != nil {
		return nil, err
	}
	timeout := maxForwardedMove
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(machine.Until(d.clock, dl), timeout)
	}
	what := strings.ToLower(strings.TrimPrefix(req.GetAction().String(), "OWNER_ACTION_"))
	if timeout <= 0 {
		return nil, fmt.Errorf("%w: %s %s: %w", roamerr.ErrDeadlineExceeded, what, key, context.DeadlineExceeded)
	}
	req.Kind, req.Id = messages.AuthorityKind(key.Kind), key.ID
	req.Requester, req.DeadlineUnixMillis = d.selfRef(), d.clock.Now().Add(timeout).UnixMilli()
	res, err := ask.Ask(ctx, d.sys, PID(ownerAddress), req, timeout, ask.Question{Clock: d.clock, From: ownerAddress, What: "forwarded move",
		Accept: func(msg any) bool { _, ok := msg.(*messages.RelocateReply); return ok }})
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return nil, fmt.Errorf("%w: %s %s at its owner %s: %w", roamerr.ErrDeadlineExceeded, what, key, ownerAddress, ctx.Err())
	}
	if err != nil {
		if errors.Is(err, actor.ErrTimeout) {
			return nil, fmt.Errorf("%w: %s %s: its owner %s did not answer in time", roamerr.ErrDeadlineExceeded, what, key, ownerAddress)
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
		if limit := d.clock.Now().Add(maxForwardedMove); m.GetDeadlineUnixMillis() <= 0 || deadline.After(limit) {
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
