// Package sessionhost is the Session owner's driver on one node: it runs
// the pure session.Owner (internal/session) in the roam/session actor,
// arms its seal timers on the node's clock, looks bound Actors up through
// the relocation driver and is the client side of a Session (Open, Spawn,
// Send, Request). docs/SESSIONS.md is the protocol.
package sessionhost

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/session"
	"github.com/roamactors/roam/internal/session/sessionrun"
	"github.com/roamactors/roam/internal/stopguard"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Service is the Session owner of one node lifecycle: the Owner's rules
// and their effects (sessionrun) run in turns of one machine.Loop, which
// the commands of other nodes' hand-offs (at the roam/session actor), the
// client side's calls (Session's methods), the seal timers and the store
// looks' answers all post to. The fields below it are the loop's: read
// and written only in its turns.
type Service struct {
	// loop runs the turns and owns the seal timers and looks' pauses, on
	// the node's clock; it closes with the lifecycle (Stop).
	loop     *machine.Loop[sessionrun.Timer]
	stopOnce sync.Once
	// runner runs the Owner's rules and effects (sessionrun), on this
	// Service's primitives (host).
	runner *sessionrun.Runner
	open   map[session.ID]*Session
	closed bool
	// binding: the Actors being spawned bound to a Session (SpawnActor),
	// until the Session owner holds their binding. A seal request for one
	// of them meanwhile is answered Unavailable (try again), not NotFound,
	// which would make its mover drop the binding.
	binding map[bindingKey]int

	cfg     session.Config
	driver  *relocation.Driver
	sys     *actor.ActorSystem
	address string
	self    *actor.PID
	log     zerolog.Logger
	// dropCommands, if set, drops the commands it returns true for
	// (tests: a lost route update).
	dropCommands atomic.Pointer[func(any) bool]
}

type bindingKey struct {
	session session.ID
	actor   string
}

// Start spawns the node's Session owner actor on the driver's system.
func Start(d *relocation.Driver, cfg session.Config, log zerolog.Logger) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	s := &Service{
		open: map[session.ID]*Session{}, loop: machine.NewLoop[sessionrun.Timer](d.Clock()),
		cfg: cfg, driver: d, sys: d.System(), address: d.System().Address(), log: log,
	}
	s.runner = sessionrun.New(session.New(cfg), (*host)(s))
	// The guard only for what peers send while it is being spawned
	// (stopguard): its stops are not guarded.
	mailbox := stopguard.Producer(actor.Unbounded(), func() bool { return true }, func(any) {})
	pid, err := s.sys.Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return (*commands)(s) }, actor.WithMailbox(mailbox), actor.WithGuardian(relocation.RestartAlways)), relocation.SessionOwnerName)
	if err != nil {
		return nil, fmt.Errorf("%w: session owner: %w", roamerr.ErrUnavailable, err)
	}
	s.self = pid
	return s, nil
}

// Stop closes every Session (their clients see ErrUnavailable), ends the
// loop (the seal waits end with the lifecycle) and stops the actor.
func (s *Service) Stop() {
	s.stopOnce.Do(func() {
		// Turns never block, so the loop gets to this one.
		_ = s.loop.Do(context.Background(), func() {
			s.closed = true
			var effects []session.Effect
			for id := range s.open {
				effects = append(effects, s.runner.Owner().Step(session.CloseSession{Session: id, Err: fmt.Errorf("%w: session closed: the node is stopping", roamerr.ErrUnavailable)})...)
			}
			s.runner.Run(effects)
			s.runner.Close()
		})
		s.loop.Close()
		<-s.loop.Done()
		// Wait for the actor's end: a next lifecycle on the same actor
		// system spawns its own under the same name.
		_ = s.sys.Root.StopFuture(s.self).Wait()
	})
}

// do runs f as a turn of the loop and waits for it; ErrClosed
// (Unavailable) once the lifecycle stopped. Turns never block, so the
// wait is short; callers without a context of their own pass Background.
func (s *Service) do(ctx context.Context, f func()) error { return s.loop.Do(ctx, f) }

// step feeds ev and runs its effects; in a turn.
func (s *Service) step(ev session.Event) []session.Effect { return s.runner.Step(ev) }

// host is the Service as the runner's primitives (sessionrun.Env); every
// call comes in a turn. Effects that send (Deliver) run in the turn, so
// the order the Owner decided is the order the transport sees; user
// callbacks never run in a turn.
type host Service

var _ sessionrun.Env = (*host)(nil)

func (h *host) Deliver(actorID string, r session.Route, item session.Item) {
	item.Msg.(*outbound).deliver((*Service)(h), actorID, r)
}

func (h *host) Refuse(item session.Item, err error) { item.Msg.(*outbound).refuse(err) }

// ReplySeal is answered by the commands actor from the step's effects:
// the reply goes to the sender of its context.
func (h *host) ReplySeal(session.ReplySeal) {}

// Reject is returned to the local call from the step's effects.
func (h *host) Reject(error) {}

func (h *host) Arm(t sessionrun.Timer, d time.Duration) {
	s := (*Service)(h)
	s.loop.Arm(t, d, func() { s.runner.Fire(t) })
}

func (h *host) Stop(t sessionrun.Timer) { h.loop.Cancel(t) }

// Look reads the store off the loop and posts the answer as a turn
// (dropped if the lifecycle stopped meanwhile: the runner is closed).
func (h *host) Look(id session.ID, actorID string) {
	s := (*Service)(h)
	go func() {
		ctx, cancel := machine.WithTimeout(context.Background(), s.driver.Clock(), 5*time.Second)
		r, alive, err := s.driver.BoundRoute(ctx, actorID)
		cancel()
		s.loop.Post(func() { s.runner.Looked(id, actorID, routeFrom(r), alive, err) })
	}()
}

func (h *host) Recovered(id session.ID, actorID string) {
	if c := h.open[id]; c != nil && c.opts.OnRecovered != nil {
		go c.opts.OnRecovered(actorID) // never under the lock
	}
}

func (h *host) Closed(id session.ID, err error) {
	if c := h.open[id]; c != nil {
		delete(h.open, id)
		c.end(err)
	}
}

func (h *host) Log(e session.Log) {
	machine.LogEvent(h.log, e.Level).Str("event", e.Event).Str("session_id", string(e.Session)).Str("object_id", e.Actor).
		Uint64("relocation_id", e.Move.RelocationID).Uint64("target_attempt", e.Move.TargetAttemptGeneration).Msg(e.Msg)
}

// commands is the roam/session actor: commands 42, 43 and 44 from the
// hand-offs of other nodes (and this one). The sender's address is what
// the transport vouches for (with TLS, a host the connection's
// certificate names: meshnode.ControlActors).
type commands Service

func (c *commands) Receive(ctx actor.Context) {
	s := (*Service)(c)
	if drop := s.dropCommands.Load(); drop != nil && (*drop)(ctx.Message()) {
		return
	}
	from := ""
	if sender := ctx.Sender(); sender != nil {
		from = sender.Address
	}
	switch m := ctx.Message().(type) {
	case *messages.SessionSeal:
		var effects []session.Effect
		spawning := false
		if err := s.do(context.Background(), func() {
			effects = s.step(session.SealRequest{From: from, Session: session.ID(m.GetSessionId()), Actor: m.GetActorId(), Move: handoff.IdentityFromProto(m.GetIdentity()), Source: routeFrom(m.GetSourceRoute())})
			spawning = s.binding[bindingKey{session.ID(m.GetSessionId()), m.GetActorId()}] > 0
		}); err != nil {
			// The lifecycle stopped: the mover tries again (Unavailable),
			// as with any Session owner it cannot reach.
			effects = []session.Effect{session.ReplySeal{Err: err}}
		}
		for _, e := range effects {
			if r, ok := e.(session.ReplySeal); ok && ctx.Sender() != nil {
				if spawning && errors.Is(r.Err, roamerr.ErrNotFound) {
					r.Err = fmt.Errorf("%w: Actor %q is being bound to session %s", roamerr.ErrUnavailable, m.GetActorId(), m.GetSessionId())
				}
				reply := &messages.SessionSealReply{Identity: m.GetIdentity(), SessionId: m.GetSessionId(), ActorId: m.GetActorId()}
				if r.Err != nil {
					reply.Code, reply.Detail = roamerr.Code(r.Err), r.Err.Error()
				}
				ctx.Request(ctx.Sender(), reply)
			}
		}
	case *messages.SessionRouteUpdate:
		if m.GetIdentity() == nil {
			// A recovering node's word, no move's: the store says where
			// the Actor serves, not the sender.
			s.loop.Post(func() { s.runner.Resolve(session.ID(m.GetSessionId()), m.GetActorId()) })
			return
		}
		s.loop.Post(func() {
			s.step(session.RouteUpdate{From: from, Session: session.ID(m.GetSessionId()), Actor: m.GetActorId(), Move: handoff.IdentityFromProto(m.GetIdentity()), Target: routeFrom(m.GetTargetRoute())})
		})
	case *messages.RelocationAbort:
		if m.GetSessionId() == "" {
			return
		}
		s.loop.Post(func() {
			s.step(session.Abort{From: from, Session: session.ID(m.GetSessionId()), Actor: m.GetActorId(), Move: handoff.IdentityFromProto(m.GetIdentity())})
		})
	}
}

func routeFrom(r *messages.SessionRoute) session.Route {
	return session.Route{Address: r.GetAddress(), OwnerGeneration: r.GetOwnerGeneration(), ObjectGeneration: r.GetObjectGeneration(), NodeRid: r.GetNodeRid()}
}

// Options configure one Session.
type Options struct {
	// OnPush receives the bound Actors' messages to the client, in the
	// order each sender sent them, one at a time on the Session's own
	// goroutine.
	OnPush func(msg any)
	// OnClose is called once when the Session ends: nil after Close, else
	// why (the seal timeout, the node stopping, a client too slow to take
	// its pushes).
	OnClose func(err error)
	// OnRecovered, if set, is called (on a goroutine of its own) when a
	// bound Actor serves again after its node ended: recovered by a live
	// node from its last checkpoint. What the client sent it shortly
	// before may have been lost with the ended node (handled after that
	// checkpoint, or queued there); tell the client.
	OnRecovered func(actorID string)
	// PushBuffer bounds the pushes waiting for OnPush (default 4,096);
	// past it the Session is closed with CapacityExceeded rather than a
	// push dropped.
	PushBuffer int
}

// Session is one client connection on this node.
type Session struct {
	svc    *Service
	id     session.ID
	pid    *actor.PID
	opts   Options
	pushes chan any
	done   chan struct{}
	once   sync.Once
	err    error // set before done is closed
	seq    atomic.Uint64
}

// Open opens a Session for a client that connected to this node.
func (s *Service) Open(opts Options) (*Session, error) {
	if opts.PushBuffer <= 0 {
		opts.PushBuffer = 4096
	}
	id := newID()
	c := &Session{svc: s, id: id, opts: opts, pushes: make(chan any, opts.PushBuffer), done: make(chan struct{})}
	var err error
	if derr := s.do(context.Background(), func() { err = s.open1(c) }); derr != nil {
		return nil, fmt.Errorf("%w: the node is stopping", roamerr.ErrUnavailable)
	}
	if err != nil {
		return nil, err
	}
	go c.deliverPushes()
	return c, nil
}

// open1 is Open's turn.
func (s *Service) open1(c *Session) error {
	if s.closed {
		return fmt.Errorf("%w: the node is stopping", roamerr.ErrUnavailable)
	}
	if max := s.cfg.WithDefaults().MaxSessions; len(s.open) >= max {
		return fmt.Errorf("%w: %d Sessions are open on this node, its limit (SessionConfig.MaxSessions)", roamerr.ErrCapacityExceeded, max)
	}
	if r, ok := firstReject(s.step(session.OpenSession{Session: c.id})); ok {
		return r
	}
	pid, ok := s.sys.ProcessRegistry.Add(&pushProcess{c: c}, PIDName(c.id))
	if !ok {
		s.step(session.CloseSession{Session: c.id})
		return fmt.Errorf("%w: session PID %s is taken", roamerr.ErrConflict, pid.Id)
	}
	c.pid = pid
	s.open[c.id] = c
	return nil
}

// PIDName is the PID id of Session id on its node: where the bound
// Actors' pushes go. It never moves.
func PIDName(id session.ID) string { return relocation.SessionOwnerName + "/" + string(id) }

func firstReject(effects []session.Effect) (error, bool) {
	for _, e := range effects {
		if r, ok := e.(session.Reject); ok {
			return r.Err, true
		}
	}
	return nil, false
}

// ID is the Session's ID.
func (c *Session) ID() session.ID { return c.id }

// PID is where the bound Actors' pushes to this client go.
func (c *Session) PID() *actor.PID { return c.pid }

// Done is closed when the Session ended; Err says why.
func (c *Session) Done() <-chan struct{} { return c.done }

// Err is nil while open and after Close, else why the Session ended.
func (c *Session) Err() error {
	select {
	case <-c.done:
		return c.err
	default:
		return nil
	}
}

// SpawnActor creates the relocatable Actor id of a registered kind on this
// node, bound to the Session: its first message is a SessionBound, the
// client's messages to id reach it wherever it moves, and its pushes to
// the SessionBound's PID reach OnPush.
func (c *Session) SpawnActor(ctx context.Context, stableType, id string) (*actor.PID, error) {
	s := c.svc
	if c.Err() != nil || isDone(c.done) {
		return nil, fmt.Errorf("%w: session %s is closed", roamerr.ErrUnavailable, c.id)
	}
	k := bindingKey{c.id, id}
	// Not ctx: a mark whose turn ran after its caller gave up would never
	// be taken back.
	if err := s.do(context.Background(), func() {
		if s.binding == nil {
			s.binding = map[bindingKey]int{}
		}
		s.binding[k]++
	}); err != nil {
		return nil, err
	}
	unmark := func() {
		if s.binding[k]--; s.binding[k] <= 0 {
			delete(s.binding, k)
		}
	}
	pid, route, err := s.driver.SpawnBound(ctx, stableType, id, &messages.SessionBinding{SessionId: string(c.id), OwnerAddress: s.address}, c.pid)
	if err != nil {
		s.loop.Post(unmark)
		return nil, err
	}
	var effects []session.Effect
	if err := s.do(context.Background(), func() {
		effects = s.step(session.Bind{Session: c.id, Actor: id, Route: routeFrom(route)})
		unmark()
	}); err != nil {
		// The lifecycle stopped meanwhile: as below.
		return pid, err
	}
	if r, ok := firstReject(effects); ok {
		// The Session closed meanwhile: the Actor serves on unbound; its
		// spawner decides (it may delete it).
		return pid, r
	}
	return pid, nil
}

// Send sends msg to the bound Actor id, one-way, after every earlier
// message of this client to it. While the Actor moves it is held;
// CapacityExceeded when the hold is full, NotFound when no Actor id is
// bound, Unavailable when the Session is closed.
func (c *Session) Send(actorID string, msg proto.Message) error {
	o := &outbound{msg: msg, op: c.nextOp()}
	return c.submit(actorID, o, proto.Size(msg))
}

// Request sends msg to the bound Actor id and waits for its reply within
// ctx, in the same order as Send.
func (c *Session) Request(ctx context.Context, actorID string, msg proto.Message) (proto.Message, error) {
	dl, ok := ctx.Deadline()
	if !ok {
		var cancel context.CancelFunc
		ctx, cancel = machine.WithTimeout(ctx, c.svc.driver.Clock(), 30*time.Second) // the deadline travels: the node's clock
		defer cancel()
		dl, _ = ctx.Deadline()
	}
	o := &outbound{msg: msg, op: c.nextOp(), reply: make(chan replyResult, 1)}
	rp := &replyProcess{ch: o.reply}
	pid, added := c.svc.sys.ProcessRegistry.Add(rp, relocation.ReplyRouteID(o.op, dl))
	if !added {
		return nil, fmt.Errorf("%w: the reply route %s is taken", roamerr.ErrUnavailable, pid.Id)
	}
	defer c.svc.sys.ProcessRegistry.Remove(pid)
	o.replyTo = pid
	if err := c.submit(actorID, o, proto.Size(msg)); err != nil {
		return nil, err
	}
	select {
	case r := <-o.reply:
		switch {
		case r.err != nil:
			return nil, r.err
		}
		if derr := relocation.DeliveryError(r.reply); derr != nil {
			return nil, derr
		}
		if _, dead := r.reply.(*actor.DeadLetterResponse); dead {
			return nil, fmt.Errorf("%w: Actor %q is not at its route (deleted?)", roamerr.ErrStale, actorID)
		}
		pm, ok := r.reply.(proto.Message)
		if !ok {
			return nil, fmt.Errorf("%w: reply %T is not a protobuf message", roamerr.ErrTypeMismatch, r.reply)
		}
		return pm, nil
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, fmt.Errorf("%w: no reply from Actor %q", roamerr.ErrDeadlineExceeded, actorID)
		}
		return nil, fmt.Errorf("%w: the request to Actor %q ended before its answer (%w); it may or may not have run", roamerr.ErrDeadlineExceeded, actorID, ctx.Err())
	}
}

func (c *Session) submit(actorID string, o *outbound, size int) error {
	s := c.svc
	var effects []session.Effect
	if err := s.do(context.Background(), func() {
		route, _, _ := s.runner.Owner().BindingOf(c.id, actorID)
		down := route.Address != "" && route.Address != s.address && s.driver.Departed(route.Address, route.NodeRid)
		effects = s.step(session.Client{Session: c.id, Actor: actorID, Item: session.Item{Msg: o, Bytes: size}, RouteDown: down})
	}); err != nil {
		return fmt.Errorf("session %s: %w", c.id, err)
	}
	for _, e := range effects {
		if r, ok := e.(session.Refuse); ok && r.Item.Msg == o {
			return r.Err
		}
	}
	return nil
}

func (c *Session) nextOp() string {
	return opPrefix + string(c.id[:8]) + "-" + strconv.FormatUint(c.seq.Add(1), 36)
}

// Close ends the Session: its bindings go (the Actors serve on), held
// messages are refused, OnClose gets nil.
func (c *Session) Close() {
	// Ended first: the step below ends the Session too, with the error its
	// held messages are refused with, which is not why it closed.
	c.endWith(nil)
	s := c.svc
	// Closed with the lifecycle if the loop is (Stop closed every Session).
	_ = s.do(context.Background(), func() {
		s.step(session.CloseSession{Session: c.id, Err: fmt.Errorf("%w: session %s was closed by its client", roamerr.ErrUnavailable, c.id)})
	})
}

// end is the Owner's Closed: err is why.
func (c *Session) end(err error) { c.endWith(err) }

func (c *Session) endWith(err error) {
	c.once.Do(func() {
		c.err = err
		c.svc.sys.ProcessRegistry.Remove(c.pid)
		close(c.done)
	})
}

func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// deliverPushes hands pushes to OnPush in order, then reports the end.
func (c *Session) deliverPushes() {
	for {
		select {
		case m := <-c.pushes:
			if c.opts.OnPush != nil {
				c.opts.OnPush(m)
			}
		case <-c.done:
			// What came before the end still goes to the client.
			for {
				select {
				case m := <-c.pushes:
					if c.opts.OnPush != nil {
						c.opts.OnPush(m)
					}
					continue
				default:
				}
				break
			}
			if c.opts.OnClose != nil {
				c.opts.OnClose(c.err)
			}
			return
		}
	}
}

// pushProcess is the Session's PID: the bound Actors' pushes.
type pushProcess struct{ c *Session }

func (p *pushProcess) SendUserMessage(_ *actor.PID, message any) {
	_, msg, _ := actor.UnwrapEnvelope(message)
	select {
	case p.c.pushes <- msg:
	default:
		// A client that does not take its pushes: closing it is loud,
		// dropping a push would not be.
		c := p.c
		c.svc.log.Warn().Str("event", "session_push_overflow").Str("session_id", string(c.id)).Int("buffer", c.opts.PushBuffer).
			Msg("the client does not take its pushes; the session is closed")
		s := c.svc
		s.loop.Post(func() {
			s.step(session.CloseSession{Session: c.id, Err: fmt.Errorf("%w: session closed: more than %d pushes waited for the client", roamerr.ErrCapacityExceeded, c.opts.PushBuffer)})
		})
	}
}

func (p *pushProcess) SendSystemMessage(*actor.PID, any) {}
func (p *pushProcess) Stop(*actor.PID)                   {}

// outbound is one client message on its way to the bound Actor.
type outbound struct {
	msg     proto.Message
	op      string
	reply   chan replyResult // a request's; nil for a send
	replyTo *actor.PID
}

func (o *outbound) deliver(s *Service, actorID string, r session.Route) {
	to := relocation.IncarnationPID(r.Address, location.Key(location.KindActor, actorID), r.ObjectGeneration, r.OwnerGeneration)
	env := &actor.MessageEnvelope{Message: o.msg}
	if o.reply != nil {
		env.Sender = o.replyTo
	} else {
		env.Header = map[string]string{relocation.HeaderOperation: o.op}
	}
	s.sys.Root.Send(to, env)
}

func (o *outbound) refuse(err error) {
	if o.reply != nil {
		select {
		case o.reply <- replyResult{err: err}:
		default:
		}
	}
}

type replyResult struct {
	reply any
	err   error
}

// replyProcess is a request's reply address: the first message is the
// reply.
type replyProcess struct{ ch chan replyResult }

func (p *replyProcess) SendUserMessage(_ *actor.PID, message any) {
	_, msg, _ := actor.UnwrapEnvelope(message)
	select {
	case p.ch <- replyResult{reply: msg}:
	default:
	}
}

func (p *replyProcess) SendSystemMessage(_ *actor.PID, message any) {}
func (p *replyProcess) Stop(*actor.PID)                             {}

var opPrefix = "s" + newHex(6) + "-"

func newID() session.ID { return session.ID(newHex(16)) }

func newHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
