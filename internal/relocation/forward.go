package relocation

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"

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
	if err := d.Usable(); err != nil {
		return Outcome{}, err
	}
	timeout := maxForwardedMove
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(time.Until(dl), timeout)
	}
	if timeout <= 0 {
		return Outcome{}, fmt.Errorf("%w: relocate %s: %w", roamerr.ErrDeadlineExceeded, key, context.DeadlineExceeded)
	}
	req := &messages.RelocateRequest{
		Kind: messages.AuthorityKind(key.Kind), Id: key.ID, TargetRid: targetRid,
		Requester:          d.selfRef(),
		DeadlineUnixMillis: time.Now().Add(timeout).UnixMilli(),
	}
	f := d.sys.Root.RequestFuture(PID(ownerAddress), req, timeout)
	done := make(chan struct{})
	var (
		res any
		err error
	)
	go func() { res, err = f.Result(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return Outcome{}, fmt.Errorf("%w: relocate %s at its owner %s: %w", roamerr.ErrDeadlineExceeded, key, ownerAddress, ctx.Err())
	}
	if err != nil {
		if errors.Is(err, actor.ErrTimeout) {
			return Outcome{}, fmt.Errorf("%w: relocate %s: its owner %s did not answer in time", roamerr.ErrDeadlineExceeded, key, ownerAddress)
		}
		return Outcome{}, fmt.Errorf("%w: relocate %s at its owner %s: %v", roamerr.ErrUnavailable, key, ownerAddress, err)
	}
	if err := DeliveryError(res); err != nil {
		return Outcome{}, err
	}
	r, ok := res.(*messages.RelocateReply)
	if !ok {
		return Outcome{}, fmt.Errorf("%w: relocate %s: its owner answered %T", roamerr.ErrUnavailable, key, res)
	}
	if r.GetCode() != "" {
		return Outcome{}, roamerr.FromCode(r.GetCode(), fmt.Sprintf("relocate %s at its owner %s: %s", key, ownerAddress, r.GetDetail()))
	}
	return Outcome{
		RelocationID: r.GetRelocationId(), Key: key, From: r.GetFromRid(), To: r.GetToRid(),
		Bytes: r.GetBytes(), Chunks: r.GetChunks(), Pause: time.Duration(r.GetPauseNanos()),
	}, nil
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
	if k := location.Kind(m.GetKind()); k != location.KindActor && k != location.KindInstanceSpot {
		d.sys.Root.Send(to, &messages.RelocateReply{Code: roamerr.CodeInvalidOperation, Detail: "only Actors and Instance Spots move on their own"})
		return
	}
	go func() {
		deadline := time.UnixMilli(m.GetDeadlineUnixMillis())
		if limit := time.Now().Add(maxForwardedMove); m.GetDeadlineUnixMillis() <= 0 || deadline.After(limit) {
			deadline = limit
		}
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
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
		key := location.Key(location.Kind(m.GetKind()), m.GetId())
		out, err := d.Relocate(ctx, key, m.GetTargetRid())
		if err != nil {
			reply.Code, reply.Detail = roamerr.Code(err), err.Error()
		} else {
			reply.RelocationId, reply.FromRid, reply.ToRid = out.RelocationID, out.From, out.To
			reply.Bytes, reply.Chunks, reply.PauseNanos = out.Bytes, out.Chunks, int64(out.Pause)
		}
		d.sys.Root.Send(to, reply)
	}()
}
