// Package session is the Session owner's rules (docs/SESSIONS.md): where a
// client's messages go, the seal a move of a bound Actor asks for, what is
// held meanwhile and its limits, the route update, the abort and the seal
// timeout. It is a pure machine — events in, effects out, no goroutines,
// clock or network — for every Session of one node; the driver runs the
// effects in the order returned.
package session

import (
	"fmt"
	"time"

	"github.com/roamactors/roam/internal/machine/loglevel"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/roamerr"
)

// ID names a Session (128 random bits, as text).
type ID string

// Route is where a binding delivers: the node the bound Actor's incarnation
// runs on, its owner generation and its ObjectGeneration (together they
// name the incarnation's PID).
type Route struct {
	Address          string
	OwnerGeneration  uint64
	ObjectGeneration uint64
	// NodeRid is the lifecycle at Address ("" when unknown): a Leaving
	// of an earlier lifecycle there does not take this route down.
	NodeRid string
}

// sameIncarnation: both name one incarnation (address and generations; a
// route from a node that does not send NodeRid has none).
func (r Route) sameIncarnation(o Route) bool {
	return r.Address == o.Address && r.OwnerGeneration == o.OwnerGeneration && r.ObjectGeneration == o.ObjectGeneration
}

func (r Route) String() string {
	return fmt.Sprintf("%s@%d.%d", r.Address, r.ObjectGeneration, r.OwnerGeneration)
}

// Item is one client message as the Session owner sees it: opaque to it,
// with its size for the hold's byte limit.
type Item struct {
	Msg   any
	Bytes int
}

// Config bounds what a sealed binding holds and how long a seal lasts.
type Config struct {
	// HoldLimit is the most client messages one sealed binding holds
	// (default 1,024); HoldBytes their most bytes (default 1 MiB). A
	// client message past either is refused CapacityExceeded, not held.
	HoldLimit int
	HoldBytes int
	// SealTimeout is SessionRelocationSealTimeout (default 3 s): a seal
	// neither updated nor aborted by then closes the Session.
	SealTimeout time.Duration
	// RecoveryWait bounds how long a binding whose route went down holds
	// the client's messages for its Actor to serve again (recovered on a
	// live node after its owner ended, or its node reachable again);
	// past it the Session is closed, and the client told (default 60 s:
	// more than an ended owner's takeover needs, docs/FAULTS.md).
	RecoveryWait time.Duration
	// MaxSessions bounds the Sessions open on the node at once (default
	// 65,536): one more is refused CapacityExceeded. Each holds a
	// process, a push buffer and a goroutine; an application opening one
	// per client connection must not let clients open them without bound.
	MaxSessions int
}

// DefaultConfig is the configuration docs/SESSIONS.md names.
func DefaultConfig() Config {
	return Config{HoldLimit: 1024, HoldBytes: 1 << 20, SealTimeout: 3 * time.Second, RecoveryWait: time.Minute, MaxSessions: 65536}
}

// WithDefaults fills zero fields from DefaultConfig.
func (c Config) WithDefaults() Config {
	d := DefaultConfig()
	if c.HoldLimit == 0 {
		c.HoldLimit = d.HoldLimit
	}
	if c.HoldBytes == 0 {
		c.HoldBytes = d.HoldBytes
	}
	if c.SealTimeout == 0 {
		c.SealTimeout = d.SealTimeout
	}
	if c.RecoveryWait == 0 {
		c.RecoveryWait = d.RecoveryWait
	}
	if c.MaxSessions == 0 {
		c.MaxSessions = d.MaxSessions
	}
	return c
}

// Validate rejects negative limits.
func (c Config) Validate() error {
	if c.HoldLimit < 0 || c.HoldBytes < 0 || c.SealTimeout < 0 || c.RecoveryWait < 0 || c.MaxSessions < 0 {
		return fmt.Errorf("%w: session hold limits, seal timeout, recovery wait and session limit must not be negative", roamerr.ErrInvalidOperation)
	}
	return nil
}

// Owner is the Session owner of one node.
type Owner struct {
	cfg      Config
	sessions map[ID]*session
}

// session is one open Session: its bindings by Actor ID.
type session struct {
	bindings map[string]*binding
}

// binding is one Actor bound to a Session. Invariant: route is where every
// client message not held went, in the client's order; while seal is set,
// every client message of this binding is in seal.held (or was refused),
// none went anywhere.
type binding struct {
	route Route
	seal  *seal
}

// seal is a binding's state during one move of its Actor, or (recovery)
// while its route is down and the Actor is looked for.
type seal struct {
	move      handoff.Identity
	recovery  bool
	held      []Item
	heldBytes int
}

// New makes the Session owner of a node.
func New(cfg Config) *Owner {
	return &Owner{cfg: cfg.WithDefaults(), sessions: map[ID]*session{}}
}

// Open reports whether the Session is open.
func (o *Owner) Open(id ID) bool { return o.sessions[id] != nil }

// BindingOf is the binding's route and whether it is sealed (ok false: no
// such Session or binding).
func (o *Owner) BindingOf(id ID, actor string) (r Route, sealed bool, ok bool) {
	s := o.sessions[id]
	if s == nil {
		return Route{}, false, false
	}
	b := s.bindings[actor]
	if b == nil {
		return Route{}, false, false
	}
	return b.route, b.seal != nil, true
}

// Held is how many client messages the binding holds.
func (o *Owner) Held(id ID, actor string) int {
	if s := o.sessions[id]; s != nil {
		if b := s.bindings[actor]; b != nil && b.seal != nil {
			return len(b.seal.held)
		}
	}
	return 0
}

// Step feeds one event and returns the effects to run, in order.
func (o *Owner) Step(ev Event) []Effect {
	switch ev := ev.(type) {
	case OpenSession:
		if o.sessions[ev.Session] != nil {
			return []Effect{Reject{Err: fmt.Errorf("%w: session %s is open already", roamerr.ErrAlreadyExists, ev.Session)}}
		}
		o.sessions[ev.Session] = &session{bindings: map[string]*binding{}}
		return nil

	case Bind:
		s := o.sessions[ev.Session]
		if s == nil {
			return []Effect{Reject{Err: fmt.Errorf("%w: session %s is not open", roamerr.ErrNotFound, ev.Session)}}
		}
		if s.bindings[ev.Actor] != nil {
			return []Effect{Reject{Err: fmt.Errorf("%w: Actor %q is bound to session %s already", roamerr.ErrAlreadyExists, ev.Actor, ev.Session)}}
		}
		s.bindings[ev.Actor] = &binding{route: ev.Route}
		return nil

	case Unbind:
		s := o.sessions[ev.Session]
		if s == nil || s.bindings[ev.Actor] == nil {
			return nil
		}
		b := s.bindings[ev.Actor]
		delete(s.bindings, ev.Actor)
		return o.unbound(ev.Session, ev.Actor, b, fmt.Errorf("%w: Actor %q is no longer bound to the session", roamerr.ErrNotFound, ev.Actor))

	case CloseSession:
		return o.close(ev.Session, ev.Err)

	case Client:
		s := o.sessions[ev.Session]
		if s == nil {
			return []Effect{Refuse{Session: ev.Session, Item: ev.Item, Err: fmt.Errorf("%w: session %s is closed", roamerr.ErrUnavailable, ev.Session)}}
		}
		b := s.bindings[ev.Actor]
		if b == nil {
			return []Effect{Refuse{Session: ev.Session, Item: ev.Item, Err: fmt.Errorf("%w: no Actor %q is bound to session %s", roamerr.ErrNotFound, ev.Actor, ev.Session)}}
		}
		var effects []Effect
		if b.seal == nil {
			if !ev.RouteDown {
				return []Effect{Deliver{Session: ev.Session, Actor: ev.Actor, Route: b.route, Item: ev.Item}}
			}
			// Not sent into a lost connection: held, while the store says
			// where the Actor serves (docs/SESSIONS.md §5).
			b.seal = &seal{recovery: true}
			effects = append(effects,
				Log{Level: loglevel.Warn, Event: "session_route_down", Session: ev.Session, Actor: ev.Actor,
					Msg: "the bound Actor's node is unreachable; the client's messages are held until the Actor serves again"},
				StartSealTimer{Session: ev.Session, Actor: ev.Actor, After: o.cfg.RecoveryWait},
				Resolve{Session: ev.Session, Actor: ev.Actor})
		}
		sl := b.seal
		if len(sl.held) >= o.cfg.HoldLimit || sl.heldBytes+ev.Item.Bytes > o.cfg.HoldBytes {
			// Not held, not dropped: the client is told now, and the
			// Session stays open (docs/SESSIONS.md §3).
			why := "is moving"
			if sl.recovery {
				why = "is unreachable (its node ended or was cut off; it is being recovered)"
			}
			return []Effect{Refuse{Session: ev.Session, Item: ev.Item, Err: fmt.Errorf("%w: Actor %q %s and session %s holds %d messages (%d bytes) for it already",
				roamerr.ErrCapacityExceeded, ev.Actor, why, ev.Session, len(sl.held), sl.heldBytes)}}
		}
		sl.held = append(sl.held, ev.Item)
		sl.heldBytes += ev.Item.Bytes
		return effects

	case Resolved:
		return o.resolved(ev)

	case SealRequest:
		return o.sealRequest(ev)
	case RouteUpdate:
		return o.routeUpdate(ev)
	case Abort:
		return o.abort(ev)

	case SealExpired:
		b := o.binding(ev.Session, ev.Actor)
		if b == nil || b.seal == nil || b.seal.move != ev.Move {
			return nil // released meanwhile: a timer that fired late
		}
		if b.seal.recovery {
			effects := []Effect{Log{Level: loglevel.Warn, Event: "session_recovery_timeout", Session: ev.Session, Actor: ev.Actor,
				Msg: "the bound Actor did not serve again within the recovery wait; the session is closed"}}
			return append(effects, o.close(ev.Session, fmt.Errorf("%w: session closed: Actor %q did not serve again within %v after its node became unreachable",
				roamerr.ErrUnavailable, ev.Actor, o.cfg.RecoveryWait))...)
		}
		// No route update and no abort in time: the move's outcome is not
		// this node's to guess. The connection ends, with everything the
		// Session held (docs/SESSIONS.md §4).
		effects := []Effect{Log{Level: loglevel.Warn, Event: "session_seal_timeout", Session: ev.Session, Actor: ev.Actor, Move: ev.Move,
			Msg: "no route update or abort within the seal timeout; the session is closed"}}
		return append(effects, o.close(ev.Session, fmt.Errorf("%w: session closed: the relocation of Actor %q was not confirmed within %v", roamerr.ErrUnavailable, ev.Actor, o.cfg.SealTimeout))...)
	}
	return nil
}

func (o *Owner) binding(id ID, actor string) *binding {
	if s := o.sessions[id]; s != nil {
		return s.bindings[actor]
	}
	return nil
}

// sealRequest checks command 42 (docs/SESSIONS.md §2): the sender is the
// source route's node, the Session is open and binds the Actor, its route
// is the declared source route, and no other move sealed it. The same move
// asking again is answered sealed again (a resent request).
func (o *Owner) sealRequest(ev SealRequest) []Effect {
	reply := func(err error) []Effect {
		return []Effect{ReplySeal{To: ev.From, Session: ev.Session, Actor: ev.Actor, Move: ev.Move, Err: err}}
	}
	if ev.From != ev.Source.Address {
		return reply(fmt.Errorf("%w: a seal request must come from the source route's node", roamerr.ErrPermissionDenied))
	}
	b := o.binding(ev.Session, ev.Actor)
	if b == nil {
		return reply(fmt.Errorf("%w: no Actor %q is bound to session %s", roamerr.ErrNotFound, ev.Actor, ev.Session))
	}
	if !b.route.sameIncarnation(ev.Source) {
		return reply(fmt.Errorf("%w: the binding's route is not the declared source route", roamerr.ErrStale))
	}
	if b.seal != nil {
		if b.seal.move == ev.Move {
			return reply(nil)
		}
		return reply(fmt.Errorf("%w: the binding is sealed by another move", roamerr.ErrConflict))
	}
	b.seal = &seal{move: ev.Move}
	return append([]Effect{StartSealTimer{Session: ev.Session, Actor: ev.Actor, Move: ev.Move, After: o.cfg.SealTimeout}}, reply(nil)...)
}

// routeUpdate applies command 43: only the seal of exactly this move, sent
// by the target route's node. The held messages go to the new route in
// their order, then the seal is released, so a later client message
// follows them on the same route.
func (o *Owner) routeUpdate(ev RouteUpdate) []Effect {
	b := o.binding(ev.Session, ev.Actor)
	var why string
	switch {
	case ev.From != ev.Target.Address:
		why = "not sent by the target route's node"
	case b == nil:
		why = "no such session or binding (closed, or the seal timed out)"
	case b.seal == nil:
		why = "the binding is not sealed (a duplicate, or after the seal timeout)"
	case b.seal.move != ev.Move:
		why = "the binding is sealed by another move"
	}
	if why != "" {
		return []Effect{Log{Level: loglevel.Warn, Event: "session_route_update_ignored", Session: ev.Session, Actor: ev.Actor, Move: ev.Move, Msg: "route update ignored: " + why}}
	}
	b.route = ev.Target
	return o.release(ev.Session, ev.Actor, b)
}

// resolveAgain is the pause between two looks for a held binding's Actor.
const resolveAgain = 250 * time.Millisecond

// resolved applies where the store says a bound Actor serves. A newer
// incarnation of the same object (a higher owner generation: recovered
// after its owner ended, or moved without this Session's seal) becomes
// the route; a binding held because its route went down is released to
// it, or to its old route once that owner is known alive again. Until
// then it keeps looking.
func (o *Owner) resolved(ev Resolved) []Effect {
	b := o.binding(ev.Session, ev.Actor)
	if b == nil {
		return nil
	}
	if b.seal != nil && !b.seal.recovery {
		return nil // a move's seal: its route update or abort decides
	}
	if b.route.NodeRid == "" && ev.Route.sameIncarnation(b.route) {
		// A route an older node gave without its lifecycle: the store's
		// names it, so a Leaving of another lifecycle at the address no
		// longer takes this route down.
		b.route.NodeRid = ev.Route.NodeRid
	}
	newer := ev.Route.ObjectGeneration == b.route.ObjectGeneration && ev.Route.OwnerGeneration > b.route.OwnerGeneration
	held := b.seal != nil
	switch {
	case newer && ev.Alive:
		b.route = ev.Route
		effects := []Effect{Log{Level: loglevel.Info, Event: "session_route_recovered", Session: ev.Session, Actor: ev.Actor,
			Msg: "the bound Actor serves at a new route; the client's messages go there"},
			Recovered{Session: ev.Session, Actor: ev.Actor, Route: ev.Route}}
		if held {
			effects = append(effects, o.release(ev.Session, ev.Actor, b)...)
		}
		return effects
	case !held:
		return nil
	case ev.Route.sameIncarnation(b.route) && ev.Alive:
		return o.release(ev.Session, ev.Actor, b)
	}
	return []Effect{Resolve{Session: ev.Session, Actor: ev.Actor, After: resolveAgain}}
}

// abort applies command 44: only the seal of exactly this move, sent by
// the (unchanged) source route's node, which serves again. The held
// messages go to it in their order, then the seal is released.
func (o *Owner) abort(ev Abort) []Effect {
	b := o.binding(ev.Session, ev.Actor)
	var why string
	switch {
	case b == nil:
		why = "no such session or binding (closed, or the seal timed out)"
	case ev.From != b.route.Address:
		why = "not sent by the binding route's node"
	case b.seal == nil:
		why = "the binding is not sealed"
	case b.seal.move != ev.Move:
		why = "the binding is sealed by another move"
	}
	if why != "" {
		return []Effect{Log{Level: loglevel.Warn, Event: "session_abort_ignored", Session: ev.Session, Actor: ev.Actor, Move: ev.Move, Msg: "abort ignored: " + why}}
	}
	return o.release(ev.Session, ev.Actor, b)
}

func (o *Owner) release(id ID, actor string, b *binding) []Effect {
	sl := b.seal
	b.seal = nil
	effects := make([]Effect, 0, len(sl.held)+1)
	effects = append(effects, StopSealTimer{Session: id, Actor: actor, Move: sl.move})
	for _, it := range sl.held {
		effects = append(effects, Deliver{Session: id, Actor: actor, Route: b.route, Item: it})
	}
	return effects
}

// unbound ends a binding: what it held is refused with err.
func (o *Owner) unbound(id ID, actor string, b *binding, err error) []Effect {
	if b.seal == nil {
		return nil
	}
	effects := []Effect{StopSealTimer{Session: id, Actor: actor, Move: b.seal.move}}
	for _, it := range b.seal.held {
		effects = append(effects, Refuse{Session: id, Item: it, Err: err})
	}
	return effects
}

// close clears a Session: its bindings, seals and held messages (each held
// one refused with err), then the connection ends.
func (o *Owner) close(id ID, err error) []Effect {
	s := o.sessions[id]
	if s == nil {
		return nil
	}
	delete(o.sessions, id)
	var effects []Effect
	for actor, b := range s.bindings {
		effects = append(effects, o.unbound(id, actor, b, err)...)
	}
	return append(effects, Closed{Session: id, Err: err})
}
