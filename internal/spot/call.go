package spot

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/spot/spotcall"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Call is a direct call by Spot ID (docs/PROTOCOL.md §7.4): built fluently and
// submitted once with Do. By default it only reaches an existing Ready Spot
// (NotFound otherwise, and no creation intent is written); InstanceSpot
// allows cold activation of a Missing Instance Spot (PROTOCOL.md §7.5).
type Call struct {
	builder
	m            *Manager
	spotID       string
	msg          proto.Message
	request      bool
	instance     bool
	instanceType string
	from         string // relocation.HeaderFrom, when sampled
}

// Request starts a request to the Spot spotID; Do returns its reply.
func (m *Manager) Request(spotID string, msg proto.Message) *Call {
	return &Call{m: m, spotID: spotID, msg: msg, request: true}
}

// Send starts a one-way send to the Spot spotID; Do returns once the
// message is handed to the transport (outbound admission, PROTOCOL.md §4.2). A
// send that goes with a cold activation (the Spot is Missing, Creating, or
// its owner ended) returns once the new incarnation dispatches it, or with
// the activation's typed failure: the caller's next call cannot overtake
// it.
func (m *Manager) Send(spotID string, msg proto.Message) *Call {
	return &Call{m: m, spotID: spotID, msg: msg}
}

// InstanceSpot states Instance intent: a Missing Spot is cold-activated as
// an Instance Spot of stableType, or of the Mesh's only Instance type when
// none is given (PROTOCOL.md §7.5). At most one stable type.
func (c *Call) InstanceSpot(stableType ...string) *Call {
	if c.once("InstanceSpot") {
		c.instance = true
		switch len(stableType) {
		case 0:
		case 1:
			c.instanceType = stableType[0]
		default:
			c.err = fmt.Errorf("%w: InstanceSpot takes at most one stable type", roamerr.ErrInvalidOperation)
		}
	}
	return c
}

// InMesh names the Mesh a Missing Instance Spot is first placed on; it
// does not move or restrict an existing Spot (PROTOCOL.md §7.4).
func (c *Call) InMesh(mesh string) *Call {
	c.inMesh(mesh)
	return c
}

// From names the relocatable object whose turn makes the call (its actor
// context), so placement's co-location can count who talks to whom
// (docs/PLACEMENT.md §5): sends through an object's own context are
// counted without it, a call by Spot ID only with it. Sampled like those
// (one call in the node's SampleEvery); nothing else changes.
func (c *Call) From(ctx actor.Context) *Call {
	c.from = relocation.SenderTag(ctx)
	return c
}

// Timeout sets the one deadline over resolve, activation, dispatch and
// reply. Default Config.DefaultTimeout.
func (c *Call) Timeout(d time.Duration) *Call {
	c.withTimeout(d)
	return c
}

func (c *Call) validate() error {
	if err := c.submit("call"); err != nil {
		return err
	}
	if err := c.m.d.Usable(); err != nil {
		return err
	}
	if err := ValidateID(c.spotID); err != nil {
		return err
	}
	if c.msg == nil {
		return fmt.Errorf("%w: no message", roamerr.ErrInvalidOperation)
	}
	if n := proto.Size(c.msg); n > meshnode.MaxMessageBytes {
		// Over the peers' frame limit it could never be delivered.
		return fmt.Errorf("%w: the message is %d bytes, more than the %d a node accepts", roamerr.ErrCapacityExceeded, n, meshnode.MaxMessageBytes)
	}
	if c.mesh != "" && !c.instance {
		return fmt.Errorf("%w: InMesh needs Instance intent", roamerr.ErrInvalidOperation)
	}
	if c.instanceType != "" {
		return ValidateStableType(c.instanceType)
	}
	return nil
}

// Do submits the call. A request returns the handler's reply; a send
// returns nil once the message is handed to the transport (or, with a
// cold activation, dispatched). A call is never
// resubmitted to another owner after it reached a target: a stale route is
// ErrStale, a lost reply ErrDeadlineExceeded (PROTOCOL.md §7.4).
func (c *Call) Do(ctx context.Context) (proto.Message, error) {
	route := "none"
	reply, err := c.do(ctx, &route)
	c.m.met.call(route, c.instance, err)
	return reply, err
}

func (c *Call) do(ctx context.Context, route *string) (proto.Message, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	m := c.m
	cc := newCallCtx(ctx, m.clock, m.timeoutOr(c.timeout))
	defer cc.end()
	ctx = cc
	var ahead *nodeList
	var onMiss func()
	if c.instance {
		// A cold activation places the Spot from the node listing: read
		// it beside the authority (docs/PROTOCOL.md §7.5 steps 1–4).
		onMiss = func() { ahead = m.listNodesAhead(ctx, c.mesh) }
	}
	a, cached, use, err := m.takeRoute(ctx, c.spotID, onMiss)
	defer use.sent() // whatever happens before the send
	if err != nil {
		return nil, err
	}
	*route = "cache"
	if !cached {
		*route = "store"
	}
	op := newOperationID()
	in := spotcall.Intent{SpotID: c.spotID, Instance: c.instance, StableType: c.instanceType, Mesh: c.mesh}
	p, err := spotcall.Route(in, spotcall.Found{V: a.v, Ended: a.ended}, c.m.clock.Now())
	if err != nil {
		return nil, err
	}
	switch p.Way {
	case spotcall.Deliver:
		return c.deliver(ctx, a.pid(), a.v.Record.GetOwner(), op, use)
	case spotcall.Place, spotcall.Reactivate:
		return c.activate(ctx, ahead, op, p)
	default: // spotcall.ToOwner
		return c.sendActivation(ctx, op, a.address, a.v.Record.GetOwner(), spotcall.OwnersActivation(a.v.Record))
	}
}

// takeRoute resolves the Spot id for a call about to send to it: from the
// route cache, counted as a use of the route, or from the store. use.sent
// must be called once the call has sent (or given up): a hinted route's barrier
// waits for every use (routeCache.use). A route being drained after a move
// is waited for, then the new owner is read (PROTOCOL.md §7.8: everything this
// node sent on the old route is handled first). Every call by Spot ID
// takes its route here, grain calls too (grainPID). onMiss, if set, runs
// before the store is read.
func (m *Manager) takeRoute(ctx context.Context, id string, onMiss func()) (a authority, cached bool, use *routeUse, err error) {
	for {
		a, cached, drained, use := m.cache.use(id)
		if cached && m.routeLost(ctx, a) {
			// Nothing sent on it can still arrive by it: the store names
			// the owner now.
			use.sent()
			m.cache.drop(id)
			continue
		}
		if cached && !a.leavingRead && m.d.PeerLeaving(a.address, a.v.Record.GetOwner().GetNodeRid()) {
			// A drained node about to stop, still connected: the store
			// names where its objects went, but what this node sent on the
			// route may still be on its way through that node's Message
			// Follow, so the route is drained like a followed one
			// (PROTOCOL.md §7.8) before the store is read.
			use.sent()
			m.onHint(id)
			continue
		}
		if cached {
			return a, true, use, nil
		}
		if drained == nil {
			a, use, drained, err = m.readRoute(ctx, id, onMiss)
			if err != nil || drained == nil {
				return a, false, use, err
			}
		}
		select {
		case <-drained:
		case <-ctx.Done():
			return authority{}, false, use, fmt.Errorf("%w: waiting for the route to Spot %q to drain: %w", roamerr.ErrDeadlineExceeded, id, ctx.Err())
		}
	}
}

// readAgain is closed: a call that waits on it reads the store again.
var readAgain = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// readRoute reads the Spot id's owner from the store for a call about to
// send to it, and caches the route counted as the call's use
// (routeCache.putUse). If another route must drain first, it returns the
// channel to wait on, and the call reads again once it is closed.
func (m *Manager) readRoute(ctx context.Context, id string, onMiss func()) (a authority, use *routeUse, drained <-chan struct{}, err error) {
	if onMiss != nil {
		onMiss()
	}
	if a, err = m.readRouteAuthority(ctx, id); err != nil {
		return authority{}, nil, nil, err
	}
	// A Spot still on a node that said it is leaving (its drain left it
	// there): this route is new, so later calls on it need no drain.
	a.leavingRead = m.d.PeerLeaving(a.address, a.v.Record.GetOwner().GetNodeRid())
	use, drained, undrained := m.cache.putUse(id, a)
	if undrained {
		// Another call cached another owner meanwhile and may have sent
		// on it: drained like a followed route before anyone goes on.
		m.onHint(id)
		if _, _, drained = m.cache.get(id); drained == nil {
			drained = readAgain // dropped already
		}
	}
	return a, use, drained, nil
}

// headers stamps the operation identity; a send's calling node (a
// request's is its reply route's, Manager.OnFollow); and a request's
// deadline: a request still queued when its caller has given up is
// answered DeadlineExceeded instead of run, also after a move
// (PROTOCOL.md §4.3, §5.5: the deadline is frozen into saved work). A
// request delivered to a Ready Spot carries none: its reply route's ID
// names its operation and deadline (relocation.ReplyRouteID).
func (c *Call) headers(ctx context.Context, op string) map[string]string {
	h := make(map[string]string, 3)
	h[relocation.HeaderOperation] = op
	if c.from != "" {
		h[relocation.HeaderFrom] = c.from
	}
	if !c.request {
		h[headerOrigin] = c.m.desc.GetAddress()
	} else if dl, ok := ctx.Deadline(); ok {
		h[relocation.HeaderDeadline] = strconv.FormatInt(dl.UnixMilli(), 10)
	}
	return h
}

// deliver sends to the owner's incarnation (route kind 1). A dead letter
// means the route is stale: the operation ends with ErrStale and the route
// is dropped, never retried elsewhere (PROTOCOL.md §7.4).
// use.sent is called right after the send (a cached route's barrier
// waits for it).
func (c *Call) deliver(ctx context.Context, pid *actor.PID, owner *messages.Owner, op string, use *routeUse) (proto.Message, error) {
	m := c.m
	if !c.request {
		m.sys.Root.Send(pid, &actor.MessageEnvelope{Message: c.msg, Header: c.headers(ctx, op)})
		use.sent()
		return nil, nil
	}
	env := &actor.MessageEnvelope{Message: c.msg}
	if c.from != "" {
		env.SetHeader(relocation.HeaderFrom, c.from)
	}
	return c.await(ctx, op, pid.Address, owner, env, false, func(env *actor.MessageEnvelope) { m.sys.Root.Send(pid, env); use.sent() })
}

// await sends env with a future as its sender — or, for a send's dispatch
// notice, named in its HeaderDispatchNotice — and waits for the reply
// within ctx.
func (c *Call) await(ctx context.Context, op, address string, owner *messages.Owner, env *actor.MessageEnvelope, notice bool, send func(*actor.MessageEnvelope)) (proto.Message, error) {
	m := c.m
	// The reply comes to a process of the call's own, read here: no
	// goroutine per call waiting on a future for it.
	rp := &replyProcess{ch: make(chan replyResult, 1)}
	dl, _ := ctx.Deadline() // the call's: deadlineCtx set one
	pid, ok := m.sys.ProcessRegistry.Add(rp, relocation.ReplyRouteID(op, dl))
	if !ok {
		// Operation ids are unique in a process: never, but a reply route
		// of another call must not be taken over (nor removed below).
		return nil, fmt.Errorf("%w: the reply route %s of the call to Spot %q is taken", roamerr.ErrUnavailable, pid.Id, c.spotID)
	}
	defer m.sys.ProcessRegistry.Remove(pid)
	if notice {
		env.SetHeader(relocation.HeaderDispatchNotice, relocation.DispatchNotice(pid))
	} else {
		env.Sender = pid
	}
	lost := m.lostSignal(address)
	// The call's deadline ends the wait through the reply's own channel,
	// its caller's cancellation through the caller's Done (callCtx).
	caller := ctx
	if cc, ok := ctx.(*callCtx); ok {
		caller = cc.parent
		t := m.clock.AfterFunc(machine.Until(m.clock, cc.at), rp.expire)
		defer t.Stop()
	}
	send(env)
	var reply any
	var err error
	// While the reply is awaited, the owner's lifecycle is checked now and
	// then (on the manager's one liveness tick): the transport drops what
	// was in flight to a node that left, so its end in the store ends the
	// call at once rather than at its deadline.
	tick := m.livenessTick()
wait:
	for {
		select {
		case r := <-rp.ch:
			reply, err = r.reply, r.err
			break wait
		case <-tick:
			tick = m.livenessTick()
			if _, alive, lerr := m.ownerAddress(ctx, owner); spotcall.OwnerGone(alive, lerr) {
				return nil, c.ended(spotcall.OwnerLeft, notice, address, nil)
			}
			continue
		case <-caller.Done():
			cerr := caller.Err()
			if errors.Is(cerr, context.DeadlineExceeded) || errors.Is(context.Cause(caller), context.DeadlineExceeded) {
				err = actor.ErrTimeout // the call's deadline: no answer in time
				break wait
			}
			// The caller cancelled: the call ends now, its outcome
			// unknown.
			return nil, c.ended(spotcall.Cancelled, notice, address, cerr)
		case <-lost:
			// Proto.Actor drops what was in flight on a lost connection
			// (PROTOCOL.md §4.1); the call may or may not have run, and is
			// not resent (PROTOCOL.md §7.4). It ends now instead of at its
			// deadline.
			return nil, c.ended(spotcall.ConnectionLost, notice, address, nil)
		}
	}
	switch {
	case errors.Is(err, actor.ErrDeadLetter):
		return nil, c.ended(spotcall.DeadLetter, notice, address, nil)
	case errors.Is(err, actor.ErrTimeout):
		return nil, c.ended(spotcall.TimedOut, notice, address, nil)
	case err != nil:
		return nil, fmt.Errorf("%w: %w", roamerr.ErrUnavailable, err)
	}
	if derr := relocation.DeliveryError(reply); derr != nil {
		if spotcall.Refused(derr) {
			m.cache.drop(c.spotID)
		}
		return nil, derr
	}
	if notice {
		return nil, nil // dispatched
	}
	pm, ok := reply.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%w: reply %T is not a protobuf message", roamerr.ErrTypeMismatch, reply)
	}
	return pm, nil
}

// ended is the error of a call whose wait ended by e, its route dropped
// if that says the route is wrong.
func (c *Call) ended(e spotcall.End, notice bool, address string, cause error) error {
	err, drop := spotcall.Ended(c.spotID, e, notice, address, cause)
	if drop {
		c.m.cache.drop(c.spotID)
	}
	return err
}

// replyProcess is a call's reply address: the first message to it is the
// reply (a dead letter answer: the target was gone), later ones are
// dropped. Its ID (relocation.ReplyRouteID) starts with "future", as a
// Proto.Actor future's does, so that peers treat it as a request's reply
// address, and names the call's operation id and deadline.
type replyProcess struct{ ch chan replyResult }

type replyResult struct {
	reply any
	err   error
}

func (p *replyProcess) SendUserMessage(_ *actor.PID, message any) {
	_, msg, _ := actor.UnwrapEnvelope(message)
	r := replyResult{reply: msg}
	if _, ok := msg.(*actor.DeadLetterResponse); ok {
		r = replyResult{err: actor.ErrDeadLetter}
	}
	select {
	case p.ch <- r:
	default:
	}
}

// expire ends the wait at the call's deadline, unless the reply came
// first.
func (p *replyProcess) expire() {
	select {
	case p.ch <- replyResult{err: actor.ErrTimeout}:
	default:
	}
}

func (p *replyProcess) SendSystemMessage(_ *actor.PID, message any) {
	select {
	case p.ch <- replyResult{reply: message}:
	default:
	}
}

func (p *replyProcess) Stop(*actor.PID) {}

// livenessTick is closed at the manager's next second (everySecond): one
// timer for every waiting call.
func (m *Manager) livenessTick() <-chan struct{} { return *m.tick.Load() }

// activate selects the target of a cold activation (PROTOCOL.md §7.5
// steps 4–7) and sends it the activation envelope. The source writes
// nothing to the store: only the target reserves. ahead is the node
// listing started beside the authority read, if any.
func (c *Call) activate(ctx context.Context, ahead *nodeList, op string, p spotcall.Plan) (proto.Message, error) {
	l := c.m.nodesOf(ctx, ahead, p.Mesh)
	target, act, err := spotcall.Target(p, c.spotID, l.nodes, l.err)
	if err != nil {
		return nil, err
	}
	return c.sendActivation(ctx, op, target.Node.GetAddress(), location.OwnerOf(target.Node), act)
}

// sendActivation completes and sends a SpotActivation (route kind 2) with the
// first message inside.
func (c *Call) sendActivation(ctx context.Context, op, address string, owner *messages.Owner, act *messages.SpotActivation) (proto.Message, error) {
	m := c.m
	dl, _ := ctx.Deadline()
	spotcall.Complete(act, op, c.spotID, dl, m.desc.GetNodeRid(), m.desc.GetNodeGeneration())
	send := func(env *actor.MessageEnvelope) {
		first, err := relocation.ToWire(c.spotID, env)
		if err != nil {
			relocation.RespondFailure(m.sys, env.Sender, c.msg, c.spotID, err)
			return
		}
		act.First = first
		m.sys.Root.RequestWithCustomSender(servicePID(address), act, m.self)
	}
	env := &actor.MessageEnvelope{Message: c.msg, Header: c.headers(ctx, op)}
	if !c.request {
		if _, err := relocation.ToWire(c.spotID, env); err != nil {
			return nil, err
		}
	}
	return c.await(ctx, op, address, owner, env, !c.request, send)
}
