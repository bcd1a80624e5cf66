// Package chat is roam's example application: chat rooms whose members
// are the users' own Actors, each bound to its client's Session.
//
// A client connects to any node's Gateway ("chat/gateway"): the gateway
// opens a roam Session for it and spawns the user's Actor there, bound to
// the Session. Joining a room creates it if needed (a User Spot, created
// by GetOrCreate) and joins the user's Actor to it — a cross-node Actor
// Join that moves the Actor to the room's node when the room lives
// elsewhere; the client stays connected to its gateway. A post goes client
// → gateway → Session → the user's Actor → the room, which broadcasts it to
// every member's Session, and the Session pushes it to its client. Rooms
// and users' Actors move (Relocate, a drain) with their state and queues
// while people keep talking; the Session holds a user's messages while its
// Actor moves and sends them on after, in order.
//
// Any process that reaches a node can talk to its gateway, so the gateway
// trusts no message: each handler checks what it needs (a sender to
// answer, names, an inbox, sizes) and none panics on any input. Each
// client costs a Session and an Actor, so a gateway holds at most
// GatewayOptions.MaxClients of them and lets go of idle ones
// (GatewayOptions.IdleTimeout). It has no authentication: a client is
// whoever names it, as in any example not to be put on an open network
// as is.
package chat

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/examples/chat/chatpb"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// StableType is the rooms' kind.
const StableType = "room"

// UserType is the kind of the users' Actors.
const UserType = "chat-user"

// History is how many posts a room keeps and moves.
const History = 100

// MaxPostBytes bounds a post's text and name: a room keeps History posts
// and moves them, and sends each to every member.
const MaxPostBytes = 64 << 10

// GatewayName is the PID id of every chat node's gateway.
const GatewayName = "chat/gateway"

// MaxRoomMembers bounds a room's member list: each post goes to every
// member, and the list moves with the room.
const MaxRoomMembers = 10_000

// MaxNameBytes is the longest user name: the user's Actor ID,
// UserActor(name), must stay within roam's longest ID
// (location.MaxIDBytes). Room names may have location.MaxIDBytes.
const MaxNameBytes = location.MaxIDBytes - len("user-")

// The errors the chat answers with (as text, in Ack.Error and the like),
// each in a roam error class.
var (
	// ErrInvalidRequest: a message without what it needs (a name, a room,
	// an inbox) or with a field over its size.
	ErrInvalidRequest = fmt.Errorf("chat: invalid request: %w", roamerr.ErrInvalidOperation)
	// ErrTooManyClients: a Connect past the gateway's MaxClients. Another
	// node's gateway, or this one later, may have room.
	ErrTooManyClients = fmt.Errorf("chat: this gateway has its most clients connected, try later or another node: %w", roamerr.ErrCapacityExceeded)
	// ErrGatewayBusy: a request past the gateway's MaxPending.
	ErrGatewayBusy = fmt.Errorf("chat: this gateway is serving its most requests at once, try again: %w", roamerr.ErrCapacityExceeded)
	// ErrRoomFull: a Join past MaxRoomMembers.
	ErrRoomFull = fmt.Errorf("chat: the room has its most members: %w", roamerr.ErrCapacityExceeded)
	// ErrIdle is why an idle client was disconnected
	// (Disconnected.Reason); it may connect again.
	ErrIdle = fmt.Errorf("chat: disconnected after sending nothing for the gateway's idle timeout: %w", roamerr.ErrUnavailable)
)

// checkID checks a name a client chose before roam or a log sees it:
// not empty, at most max bytes, UTF-8 (roam's own IDs' rule,
// location.ValidateID, which a protobuf string from the wire meets but a
// local sender's need not).
func checkID(what, id string, max int) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: %s is empty", ErrInvalidRequest, what)
	case len(id) > max:
		return fmt.Errorf("%w: %s has %d bytes, at most %d", ErrInvalidRequest, what, len(id), max)
	case !utf8.ValidString(id):
		return fmt.Errorf("%w: %s is not UTF-8", ErrInvalidRequest, what)
	}
	return nil
}

func checkRoom(room string) error { return checkID("room", room, location.MaxIDBytes) }

func checkName(name string) error { return checkID("name", name, MaxNameBytes) }

// checkInbox checks a client's inbox PID: where its pushes go.
func checkInbox(p *messages.PID) error {
	if p == nil {
		return fmt.Errorf("%w: an inbox is required", ErrInvalidRequest)
	}
	if err := checkID("inbox address", p.GetAddress(), location.MaxIDBytes); err != nil {
		return err
	}
	return checkID("inbox id", p.GetId(), location.MaxIDBytes)
}

// clip shortens what a client chose (a room or user name) before it is
// echoed or logged, at a rune boundary.
func clip(s string) string {
	const max = 128
	if len(s) <= max {
		return s
	}
	n := max
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

func ackError(err error) proto.Message { return &chatpb.Ack{Error: err.Error()} }

// respond answers the message's sender, if it has one: a one-way
// message's answer would go to the dead letters.
func respond(c actor.Context, m proto.Message) {
	if c.Sender() != nil {
		c.Respond(m)
	}
}

// Kinds are the chat's relocatable kinds: rooms (User Spots) and users'
// Actors, both moving with their state.
func Kinds() []roam.Kind {
	return []roam.Kind{
		roam.NewKind(StableType, actor.PropsFromProducer(func() actor.Actor { return &Room{} }), roam.PreserveStateWith(roomState{})),
		roam.NewKind(UserType, actor.PropsFromProducer(func() actor.Actor { return &User{} }), roam.PreserveStateWith(userState{})),
	}
}

// DirectorConfig runs the placement director with co-location
// (roam.WithPlacement): a user's Actor goes to its room's node as it
// talks. A node may own up to four times the mean number of Actors (many
// rooms may be on one node, and their users belong there); a user's Actor
// found busy is tried again after 2 s.
func DirectorConfig() roam.PlacementConfig {
	return roam.PlacementConfig{Period: 250 * time.Millisecond,
		CoLocation: roam.PlacementCoLocation{Enabled: true, Slack: 3},
		Limits:     roam.PlacementLimits{Rate: 50, Burst: 20, Concurrency: 4, Cooldown: 2 * time.Second}}
}

// UserActor is the Actor ID of the user name.
func UserActor(name string) string { return "user-" + name }

// Room is one chat room.
type Room struct {
	state chatpb.RoomState
}

func inboxPID(p *messages.PID) *actor.PID { return actor.NewPID(p.GetAddress(), p.GetId()) }

// Receive handles Join, Leave, History and Post; a Post is broadcast to
// every member's inbox and kept in the history. A room is reached through
// roam by any node, not only through a gateway: it checks what it keeps
// and broadcasts itself.
func (r *Room) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *chatpb.Join:
		mem := m.GetMember()
		err := checkName(mem.GetName())
		if err == nil {
			// A member without an inbox would get the room's posts nowhere.
			err = checkInbox(mem.GetInbox())
		}
		if err != nil {
			respond(c, ackError(err))
			return
		}
		r.leave(mem.GetName())
		if len(r.state.Members) >= MaxRoomMembers {
			respond(c, ackError(fmt.Errorf("%w (at most %d)", ErrRoomFull, MaxRoomMembers)))
			return
		}
		r.state.Members = append(r.state.Members, &chatpb.Member{Name: mem.GetName(), Inbox: mem.GetInbox()})
		respond(c, &chatpb.Joined{Room: m.GetRoom(), History: r.state.History, Members: uint32(len(r.state.Members)), Node: nodeName(c)})
	case *chatpb.Leave:
		r.leave(m.GetName())
		respond(c, &chatpb.Ack{})
	case *chatpb.History:
		respond(c, &chatpb.Joined{Room: m.GetRoom(), History: r.state.History, Members: uint32(len(r.state.Members)), Node: nodeName(c)})
	case *chatpb.Post:
		if n := len(m.GetText()) + len(m.GetName()); n > MaxPostBytes {
			respond(c, ackError(fmt.Errorf("%w: a post may have at most %d bytes, this one has %d", ErrInvalidRequest, MaxPostBytes, n)))
			return
		}
		p := &chatpb.Posted{Room: m.GetRoom(), Name: m.GetName(), Seq: m.GetSeq(), Text: m.GetText(), Index: r.state.NextIndex}
		r.state.NextIndex++
		r.state.History = append(r.state.History, p)
		if n := len(r.state.History); n > History {
			r.state.History = append([]*chatpb.Posted(nil), r.state.History[n-History:]...)
		}
		for _, mem := range r.state.Members {
			// A state restored from before members were checked may
			// hold one without an inbox: it gets nothing.
			if checkInbox(mem.GetInbox()) == nil {
				c.Send(inboxPID(mem.GetInbox()), p)
			}
		}
		respond(c, &chatpb.Ack{})
	}
}

// nodeName names the node the actor runs on, for a client that wants to
// move it elsewhere ("" between two of roam's lifecycles).
func nodeName(c actor.Context) string {
	if r := roam.Get(c.ActorSystem()); r != nil {
		return r.NodeName()
	}
	return ""
}

func (r *Room) leave(name string) {
	ms := r.state.Members[:0]
	for _, m := range r.state.Members {
		if m.GetName() != name {
			ms = append(ms, m)
		}
	}
	r.state.Members = ms
}

// roomState moves a room's members and history as a RoomState.
type roomState struct{}

func (roomState) Capture(a actor.Actor) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(&a.(*Room).state)
}

func (roomState) Restore(a actor.Actor, b []byte) error {
	return proto.Unmarshal(b, &a.(*Room).state)
}

// User is one user's Actor: it speaks for its client in rooms. It waits
// for each room call's answer before its next message, so a user's posts
// reach the room in order wherever the Actor and the room move.
type User struct {
	state chatpb.UserState
}

// callTimeout bounds a user's call to its room.
const callTimeout = 5 * time.Second

func (u *User) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *messages.SessionBound:
		if m.GetSession() != nil {
			u.state.Session = m.GetSession()
		}
	case *chatpb.Join:
		// Sent by the gateway once the Actor joined the room's Spot. The
		// member's inbox is the Session this Actor is bound to, whatever
		// the message said.
		name := m.GetMember().GetName()
		join := &chatpb.Join{Room: m.GetRoom(), Member: &chatpb.Member{Name: name, Inbox: u.state.Session}}
		reply, err := u.call(c, m.GetRoom(), join)
		if err != nil {
			reply = ackError(err)
		} else {
			u.state.Name, u.state.Room = name, m.GetRoom()
		}
		respond(c, reply)
	case *chatpb.Post:
		if _, err := u.call(c, m.GetRoom(), m); err != nil && u.state.Session != nil {
			// Not lost quietly: the client hears of it.
			c.Send(inboxPID(u.state.Session), &chatpb.PostRefused{Room: clip(m.GetRoom()), Name: clip(m.GetName()), Seq: m.GetSeq(), Error: err.Error()})
		}
	case *chatpb.Leave:
		_, err := u.call(c, m.GetRoom(), m)
		if err == nil && m.GetRoom() == u.state.Room {
			u.state.Room = ""
		}
		respond(c, &chatpb.Ack{Error: errText(err)})
	}
}

// call asks the room by its Spot ID and waits for the answer.
func (u *User) call(c actor.Context, room string, msg proto.Message) (proto.Message, error) {
	if err := checkRoom(room); err != nil {
		return nil, err
	}
	r := roam.Get(c.ActorSystem())
	if r == nil {
		return nil, fmt.Errorf("%w: roam is not running on this node", roamerr.ErrUnavailable)
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	// From: the placement director (when on) sees who talks to which room.
	reply, err := r.Spots().Request(ctx, room, msg, roam.From(c))
	if err != nil {
		return nil, err
	}
	if a, ok := reply.(*chatpb.Ack); ok && a.GetError() != "" {
		return nil, errors.New(a.GetError())
	}
	return reply, nil
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// userState moves a user's name, room and Session.
type userState struct{}

func (userState) Capture(a actor.Actor) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(&a.(*User).state)
}

func (userState) Restore(a actor.Actor, b []byte) error {
	return proto.Unmarshal(b, &a.(*User).state)
}

// The gateway's limits by default (GatewayOptions). Well above what one
// node's demo needs (cmd/roam-demo: 30 clients, each posting every few
// milliseconds).
const (
	DefaultMaxClients  = 10_000
	DefaultIdleTimeout = 5 * time.Minute
	DefaultMaxPending  = 1_024
	DefaultTimeout     = 5 * time.Second
)

// GatewayOptions bound what one gateway holds for its clients: each
// connected client costs a Session and a user's Actor, and any process
// that reaches the node can connect.
type GatewayOptions struct {
	// MaxClients bounds the clients connected at once (and connecting);
	// a Connect past it is refused with ErrTooManyClients, except a
	// client connecting again under its name. Default DefaultMaxClients.
	MaxClients int
	// IdleTimeout: a client that sent nothing for this long is
	// disconnected (told ErrIdle) and its Session and Actor released as
	// when it leaves, if it is in no room or its inbox was reported gone
	// (its process ended or is unreachable, or the inbox actor stopped).
	// A client reading a room through a live inbox stays. Default
	// DefaultIdleTimeout; negative: never.
	IdleTimeout time.Duration
	// MaxPending bounds the requests (Connect, Join, Relocate, History)
	// being served at once, each on a goroutine of its own; one past it
	// is answered ErrGatewayBusy. Default DefaultMaxPending.
	MaxPending int
	// Timeout bounds each room call (a Join's or a Relocate's steps
	// three times it). Default DefaultTimeout.
	Timeout time.Duration
}

func (o GatewayOptions) withDefaults() GatewayOptions {
	if o.MaxClients <= 0 {
		o.MaxClients = DefaultMaxClients
	}
	if o.IdleTimeout == 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.MaxPending <= 0 {
		o.MaxPending = DefaultMaxPending
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	return o
}

// GatewayStats counts what a gateway refused and released.
type GatewayStats struct {
	Clients int    // connected now
	Refused uint64 // Connects refused at MaxClients
	Reaped  uint64 // idle clients disconnected
	Busy    uint64 // requests refused at MaxPending
	// Dropped counts requests without a sender to answer (and posts
	// refused with nobody to tell): nothing was done for them.
	Dropped uint64
	// Panics counts handlers that panicked and were recovered (logged
	// with event gateway_panic): a bug, never an input's fault.
	Panics uint64
}

// Gateway serves chat clients on one node: each connected client has a
// Session here, whatever node its Actor and rooms are on.
type Gateway struct {
	r       *roam.Roam
	log     zerolog.Logger
	opts    GatewayOptions
	pending chan struct{} // a slot per request being served (MaxPending)

	mu         sync.Mutex
	clients    map[string]*client
	connecting map[string]int // names being connected (they count against MaxClients)
	inFlight   int            // the sum of connecting

	self atomic.Pointer[actor.PID] // set when the actor starts
	// sweepGen is the current chain of idle sweeps; the actor's own.
	sweepGen uint64

	refused, reaped, busy, dropped, panics atomic.Uint64
	// What a client can trigger at will is logged at most once a second.
	dropLog, refuseLog, reapLog, panicLog logLimit
}

type client struct {
	name  string
	inbox *actor.PID
	s     *roam.Session

	// Under Gateway.mu.
	seen    time.Time     // when the client last sent something
	room    string        // the room it joined, "" when none
	gone    bool          // its inbox was reported terminated since it last sent
	leaving bool          // being disconnected
	left    chan struct{} // closed once disconnected: its Session and Actor released
	busy    int           // its requests under way: it is not idle meanwhile
}

// StartGateway spawns the node's gateway actor on roam's actor system with
// the default GatewayOptions. It lives as long as the system: roam's node
// lifecycles come and go under it.
func StartGateway(r *roam.Roam, log zerolog.Logger) (*actor.PID, error) {
	_, pid, err := StartGatewayWith(r, log, GatewayOptions{})
	return pid, err
}

// StartGatewayWith is StartGateway with options; the Gateway answers Stats.
func StartGatewayWith(r *roam.Roam, log zerolog.Logger, o GatewayOptions) (*Gateway, *actor.PID, error) {
	o = o.withDefaults()
	g := &Gateway{r: r, log: log, opts: o, pending: make(chan struct{}, o.MaxPending),
		clients: map[string]*client{}, connecting: map[string]int{}}
	pid, err := r.System().Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return g }), GatewayName)
	if err != nil {
		return nil, nil, err
	}
	return g, pid, nil
}

// Stats is what the gateway holds and has refused so far.
func (g *Gateway) Stats() GatewayStats {
	g.mu.Lock()
	n := len(g.clients)
	g.mu.Unlock()
	return GatewayStats{Clients: n, Refused: g.refused.Load(), Reaped: g.reaped.Load(), Busy: g.busy.Load(),
		Dropped: g.dropped.Load(), Panics: g.panics.Load()}
}

func (g *Gateway) client(name string) *client {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.clients[name]
}

// The gateway's messages to itself: local only (no protobuf type, so no
// other process can send them).
type (
	watchInbox   struct{ pid *actor.PID }
	unwatchInbox struct{ pid *actor.PID }
	sweep        struct{ gen uint64 }
)

// Receive serves clients' commands. Posts and Leaves go into the client's
// Session in the order they arrive, so one client's posts reach its room
// in order; Connect, Join, Relocate and History are requests answered
// from their own goroutine, and dropped when they come without a sender
// to answer, as is the answer to a Leave without a room (the client goes),
// which comes once the client's Session and Actor are released. Whatever a message holds, nothing here may panic: a panic on
// a goroutine would end the node.
func (g *Gateway) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		// A PID of the gateway's own for its messages to itself: Proto.Actor
		// caches in a PID the process it last resolved, whatever actor
		// system resolved it, and c.Self() is the PID StartGateway returns,
		// which an application may well use from its client's system.
		self := c.Self()
		g.self.Store(actor.NewPID(self.GetAddress(), self.GetId()))
		// Also after a restart: a new chain of sweeps, the old one ends.
		g.sweepGen++
		g.scheduleSweep(g.sweepGen)
	case *actor.Stopping:
		g.sweepGen++
	case *actor.Terminated:
		g.inboxGone(m.GetWho())
	case watchInbox:
		c.Watch(m.pid)
	case unwatchInbox:
		if !g.inboxInUse(m.pid) {
			c.Unwatch(m.pid)
		}
	case sweep:
		if m.gen == g.sweepGen {
			g.sweep()
			g.scheduleSweep(m.gen)
		}
	case *chatpb.Connect:
		from := c.Sender().GetAddress()
		g.serve(c, "connect", g.opts.Timeout, ackError, func(ctx context.Context) proto.Message { return g.connect(ctx, m, from) })
	case *chatpb.Join:
		cl := g.client(m.GetMember().GetName())
		g.working(cl, +1) // not idle while its join is under way
		if g.serve(c, "join", 3*g.opts.Timeout, ackError, func(ctx context.Context) proto.Message {
			defer g.working(cl, -1)
			return g.join(ctx, m)
		}) {
			g.touch(c, cl)
		} else {
			g.working(cl, -1)
		}
	case *chatpb.Relocate:
		refuse := func(err error) proto.Message {
			// A Relocate is answered with a Relocated, whatever happened.
			return &chatpb.Relocated{Room: clip(m.GetRoom()), To: clip(m.GetTo()), Error: err.Error()}
		}
		g.serve(c, "relocate", 3*g.opts.Timeout, refuse, func(ctx context.Context) proto.Message { return g.relocate(ctx, m) })
	case *chatpb.History:
		g.serve(c, "history", g.opts.Timeout, ackError, func(ctx context.Context) proto.Message { return g.history(ctx, m) })
	case *chatpb.Post:
		g.post(c, m)
	case *chatpb.Leave:
		g.leave(c, m)
	}
}

// serve answers a request from a goroutine of its own (handle's answer,
// or refuse's when the gateway has MaxPending requests in progress or
// handle panicked). A request without a sender is dropped: its work
// would be done for nobody, and its answer would have nowhere to go.
func (g *Gateway) serve(c actor.Context, what string, timeout time.Duration, refuse func(error) proto.Message, handle func(context.Context) proto.Message) bool {
	sender := c.Sender()
	if sender == nil {
		g.drop(what)
		return false
	}
	select {
	case g.pending <- struct{}{}:
	default:
		g.busy.Add(1)
		if e := g.refuseLog.limit(g.log.Warn()); e != nil {
			e.Str("event", "request_refused").Str("request", what).Int("pending", g.opts.MaxPending).Msg("the gateway is serving its most requests at once")
		}
		c.Respond(refuse(fmt.Errorf("%w (%d)", ErrGatewayBusy, g.opts.MaxPending)))
		return false
	}
	go func() {
		defer func() { <-g.pending }()
		reply := refuse(fmt.Errorf("chat: the gateway failed to serve the %s: %w", what, roamerr.ErrUnavailable))
		func() {
			defer g.recoverPanic(what)
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			reply = handle(ctx)
		}()
		g.r.System().Root.Send(sender, reply)
	}()
	return true
}

// drop counts a message that needed an answer but came without a sender,
// logged at debug level at most once a second: any process can send them.
func (g *Gateway) drop(what string) {
	g.dropped.Add(1)
	if e := g.dropLog.limit(g.log.Debug()); e != nil {
		e.Str("event", "request_dropped").Str("request", what).Uint64("dropped", g.dropped.Load()).Msg("a request without a sender to answer was dropped")
	}
}

// goSafe runs f on a goroutine of its own, recovering a panic.
func (g *Gateway) goSafe(what string, f func()) {
	go func() {
		defer g.recoverPanic(what)
		f()
	}()
}

// recoverPanic, deferred on the gateway's goroutines, keeps one bad
// request from ending the node: a panic outside the actor's turn is not
// caught by its supervisor. It is a bug all the same: counted
// (GatewayStats.Panics) and logged with its stack.
func (g *Gateway) recoverPanic(what string) {
	v := recover()
	if v == nil {
		return
	}
	g.panics.Add(1)
	if e := g.panicLog.limit(g.log.Error()); e != nil {
		e.Str("event", "gateway_panic").Str("request", what).Str("panic", fmt.Sprint(v)).Bytes("stack", debug.Stack()).Msg("a gateway handler panicked")
	}
}

// spots is the node's Spots API; its calls answer typed errors while roam
// is not running (between two of the node's lifecycles the gateway
// outlives).
func (g *Gateway) spots() (*roam.Spots, error) { return g.r.Spots(), nil }

func notConnected(name string) error {
	return fmt.Errorf("%w: %q is not connected to this node", roamerr.ErrNotFound, clip(name))
}

// post hands a client's post to its Session. A refusal goes to the
// sender, or else to the client's inbox.
func (g *Gateway) post(c actor.Context, m *chatpb.Post) {
	cl := g.client(m.GetName())
	g.touch(c, cl)
	if n := len(m.GetText()) + len(m.GetName()); n > MaxPostBytes {
		// Every member's inbox gets each post: one huge post would be
		// copied to all of them, and over a client's frame limit it is
		// not delivered at all. A sender hears it in the Ack, as of any
		// post it asked about.
		err := fmt.Errorf("%w: a post may have at most %d bytes, this one has %d", ErrInvalidRequest, MaxPostBytes, n)
		if e := g.refuseLog.limit(g.log.Warn()); e != nil {
			e.Str("event", "post_refused").Str("room", clip(m.GetRoom())).Int("bytes", n).Msg("a post over MaxPostBytes was refused")
		}
		if c.Sender() != nil {
			c.Respond(ackError(err))
			return
		}
		g.refusePost(c, m, cl, err)
		return
	}
	err := checkRoom(m.GetRoom())
	if err == nil && cl == nil {
		err = notConnected(m.GetName())
	}
	if err == nil {
		err = cl.s.Send(UserActor(cl.name), m)
	}
	if err != nil {
		if e := g.refuseLog.limit(g.log.Warn()); e != nil {
			e.Str("event", "post_refused").Str("room", clip(m.GetRoom())).Err(err).Msg("a post was not accepted")
		}
		g.refusePost(c, m, cl, err)
		return
	}
	respond(c, &chatpb.Ack{})
}

// refusePost tells the sender, or else the client's inbox, that its post
// was not accepted.
func (g *Gateway) refusePost(c actor.Context, m *chatpb.Post, cl *client, err error) {
	to := c.Sender()
	if to == nil && cl != nil {
		to = cl.inbox
	}
	if to == nil {
		g.dropped.Add(1) // nobody to tell
		return
	}
	c.Send(to, &chatpb.PostRefused{Room: clip(m.GetRoom()), Name: clip(m.GetName()), Seq: m.GetSeq(), Error: err.Error()})
}

// leave takes the client out of a room, or (no room) disconnects it.
func (g *Gateway) leave(c actor.Context, m *chatpb.Leave) {
	cl := g.client(m.GetName())
	if cl == nil {
		respond(c, ackError(notConnected(m.GetName())))
		return
	}
	g.touch(c, cl)
	if m.GetRoom() == "" {
		// Leaving without a room: the client goes. The answer waits until
		// its Session and Actor are released: a client that then stops, or
		// a program that then stops the node, leaves nothing behind that
		// would end later as a disconnection nobody asked for.
		g.disconnectOnce(cl)
		g.serve(c, "leave", 2*g.opts.Timeout, ackError, func(ctx context.Context) proto.Message {
			select {
			case <-cl.left:
				return &chatpb.Ack{}
			case <-ctx.Done():
				return ackError(fmt.Errorf("%w: the client's Session and Actor were not released in time", roamerr.ErrUnavailable))
			}
		})
		return
	}
	err := checkRoom(m.GetRoom())
	if err == nil {
		err = cl.s.Send(UserActor(cl.name), m)
	}
	if err != nil {
		if e := g.refuseLog.limit(g.log.Warn()); e != nil {
			e.Str("event", "leave_failed").Str("room", clip(m.GetRoom())).Err(err).Msg("a leave was not accepted")
		}
	} else {
		g.mu.Lock()
		if cl.room == m.GetRoom() {
			cl.room = ""
		}
		g.mu.Unlock()
	}
	respond(c, &chatpb.Ack{Error: errText(err)})
}

// touch notes that cl (nil: no client) sent something: it is not idle.
// If its inbox was reported gone, it is watched again: the client is
// back, or someone speaks in its name.
func (g *Gateway) touch(c actor.Context, cl *client) {
	if cl == nil {
		return
	}
	g.mu.Lock()
	cl.seen = time.Now()
	wasGone := cl.gone
	cl.gone = false
	g.mu.Unlock()
	if wasGone {
		c.Watch(cl.inbox)
	}
}

// working counts a request of cl (nil: none) starting (+1) or ending (-1):
// a request under way is no idleness, and its end counts as the client's
// last word.
func (g *Gateway) working(cl *client, d int) {
	if cl == nil {
		return
	}
	g.mu.Lock()
	cl.busy += d
	cl.seen = time.Now()
	g.mu.Unlock()
}

// connect opens the client's Session and spawns its Actor here, bound to
// it. A name connected before gets a new Actor: the old one is deleted.
func (g *Gateway) connect(ctx context.Context, m *chatpb.Connect, from string) proto.Message {
	name := m.GetName()
	if err := checkName(name); err != nil {
		return ackError(err)
	}
	if err := checkInbox(m.GetInbox()); err != nil {
		return ackError(err)
	}
	if m.GetInbox().GetAddress() != from {
		// The gateway sends to the inbox for as long as the client is
		// connected: an inbox elsewhere than the client's own process
		// would make the node dial wherever a client says.
		return ackError(fmt.Errorf("%w: the inbox must be in the connecting process (%s), not at %s", ErrInvalidRequest, clip(from), clip(m.GetInbox().GetAddress())))
	}
	g.mu.Lock()
	if g.connecting[name] > 0 {
		// Two connects under one name at once would each open a Session
		// and the later would orphan the earlier's.
		g.mu.Unlock()
		return ackError(fmt.Errorf("%w: a connect as %q is in progress", ErrInvalidRequest, clip(name)))
	}
	if g.clients[name] == nil && len(g.clients)+g.inFlight >= g.opts.MaxClients {
		g.mu.Unlock()
		g.refused.Add(1)
		if e := g.refuseLog.limit(g.log.Warn()); e != nil {
			e.Str("event", "connect_refused").Int("max_clients", g.opts.MaxClients).Uint64("refused", g.refused.Load()).Msg("a client was refused: the gateway has its most clients")
		}
		return ackError(fmt.Errorf("%w (%d)", ErrTooManyClients, g.opts.MaxClients))
	}
	g.connecting[name]++
	g.inFlight++
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		if g.connecting[name]--; g.connecting[name] <= 0 {
			delete(g.connecting, name)
		}
		g.inFlight--
		g.mu.Unlock()
	}()
	inbox := inboxPID(m.GetInbox())
	cl := &client{name: name, inbox: inbox, left: make(chan struct{})}
	s, err := g.r.OpenSession(roam.SessionOptions{
		OnPush: func(msg any) { g.r.System().Root.Send(inbox, msg) },
		OnRecovered: func(string) {
			// Not silent: posts on their way when its node ended may be gone.
			g.log.Warn().Str("event", "user_recovered").Str("name", name).Msg("a user's Actor was recovered after its node ended")
			g.r.System().Root.Send(inbox, &chatpb.Recovered{Name: name,
				Reason: "your Actor's node ended; it came back from its last checkpoint, and posts sent just before may be lost"})
		},
		OnClose: func(err error) {
			g.mu.Lock()
			registered := g.clients[name] == cl
			if registered {
				delete(g.clients, name)
			}
			// Closed by the gateway as the client left or was reaped: roam
			// reports even that Close as an error ("closed by its client"),
			// but nothing ended that the client did not ask for or was not
			// told of already.
			leaving := cl.leaving
			g.mu.Unlock()
			// No more watching an inbox no client of this gateway has.
			g.tellSelf(unwatchInbox{inbox})
			// A connect that failed closes its Session itself: its client
			// got the error as the answer, not a disconnect.
			if err != nil && registered && !leaving {
				g.log.Warn().Str("event", "client_disconnected").Str("name", name).Err(err).Msg("a client's session ended")
				g.r.System().Root.Send(inbox, &chatpb.Disconnected{Reason: err.Error()})
			}
		},
	})
	if err != nil {
		return ackError(err)
	}
	cl.s = s
	if old := g.client(name); old != nil {
		old.s.Close()
	}
	_, err = s.SpawnActor(ctx, UserType, UserActor(name))
	if errors.Is(err, roamerr.ErrAlreadyExists) {
		// Connected before (here or elsewhere): start afresh.
		if _, err = g.r.DeleteActor(ctx, roam.ActorRef(UserActor(name))); err == nil {
			_, err = s.SpawnActor(ctx, UserType, UserActor(name))
		}
	}
	if err != nil {
		s.Close()
		return ackError(err)
	}
	g.mu.Lock()
	cl.seen = time.Now()
	g.clients[name] = cl
	g.mu.Unlock()
	if err := s.Err(); err != nil {
		// It ended before it was registered: its OnClose told nobody.
		g.mu.Lock()
		if g.clients[name] == cl {
			delete(g.clients, name)
		}
		g.mu.Unlock()
		return ackError(err)
	}
	// Told when the inbox goes (its process ends, or is unreachable): an
	// idle client whose inbox is gone is disconnected (sweep).
	g.tellSelf(watchInbox{inbox})
	return &chatpb.Connected{SessionId: string(s.ID()), Node: g.r.NodeName()}
}

// join makes the client's Actor a member of the room, created if need be:
// a cross-node Actor Join when the room lives on another node (the Actor
// moves there, its Session stays here). Then the Actor joins the room's
// member list, and the client gets the room's history.
func (g *Gateway) join(ctx context.Context, m *chatpb.Join) proto.Message {
	name := m.GetMember().GetName()
	if err := checkRoom(m.GetRoom()); err != nil {
		return ackError(err)
	}
	if err := checkName(name); err != nil {
		return ackError(err)
	}
	cl := g.client(name)
	if cl == nil {
		return ackError(notConnected(name))
	}
	spots, err := g.spots()
	if err != nil {
		return ackError(err)
	}
	res, err := spots.GetOrCreate(ctx, m.GetRoom(), StableType)
	if err != nil {
		return ackError(err)
	}
	if _, err := g.r.JoinSpot(ctx, roam.ActorRef(UserActor(cl.name)), res.Ref); err != nil {
		return ackError(err)
	}
	reply, err := cl.s.Request(ctx, UserActor(cl.name), &chatpb.Join{Room: m.GetRoom(), Member: &chatpb.Member{Name: name}})
	if err != nil {
		return ackError(err)
	}
	if _, ok := reply.(*chatpb.Joined); ok {
		g.mu.Lock()
		cl.room = m.GetRoom()
		g.mu.Unlock()
	}
	return reply
}

// history answers the room's last posts.
func (g *Gateway) history(ctx context.Context, m *chatpb.History) proto.Message {
	if err := checkRoom(m.GetRoom()); err != nil {
		return ackError(err)
	}
	spots, err := g.spots()
	if err != nil {
		return ackError(err)
	}
	reply, err := spots.Request(ctx, m.GetRoom(), &chatpb.History{Room: m.GetRoom()})
	if err != nil {
		return ackError(err)
	}
	return reply
}

// disconnectOnce disconnects cl unless that is under way already.
func (g *Gateway) disconnectOnce(cl *client) {
	g.mu.Lock()
	first := !cl.leaving
	cl.leaving = true
	g.mu.Unlock()
	if first {
		g.goSafe("disconnect", func() { g.disconnect(cl) })
	}
}

// disconnect releases what a client holds: its Session, then its Actor.
// It runs once per client (under its leaving flag).
func (g *Gateway) disconnect(cl *client) {
	defer close(cl.left)
	ctx, cancel := context.WithTimeout(context.Background(), g.opts.Timeout)
	defer cancel()
	cl.s.Close()
	g.mu.Lock()
	// The name connected again meanwhile: the Actor is the new client's.
	taken := g.connecting[cl.name] > 0 || (g.clients[cl.name] != nil && g.clients[cl.name] != cl)
	g.mu.Unlock()
	if taken {
		return
	}
	if _, err := g.r.DeleteActor(ctx, roam.ActorRef(UserActor(cl.name))); err != nil {
		g.log.Warn().Str("event", "user_delete_failed").Str("name", cl.name).Err(err).Msg("a disconnected client's Actor was not deleted")
	}
}

// inboxGone marks the clients whose inbox was reported terminated: its
// actor stopped, or its process ended or cannot be reached.
func (g *Gateway) inboxGone(who *actor.PID) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, cl := range g.clients {
		if cl.inbox.GetAddress() == who.GetAddress() && cl.inbox.GetId() == who.GetId() {
			cl.gone = true
		}
	}
}

func (g *Gateway) inboxInUse(p *actor.PID) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, cl := range g.clients {
		if cl.inbox.GetAddress() == p.GetAddress() && cl.inbox.GetId() == p.GetId() {
			return true
		}
	}
	return false
}

// sweepEvery is how often idle clients are looked for: a client is
// disconnected between IdleTimeout and IdleTimeout + sweepEvery after it
// last sent something.
func (g *Gateway) sweepEvery() time.Duration {
	return min(max(g.opts.IdleTimeout/4, 10*time.Millisecond), 30*time.Second)
}

func (g *Gateway) scheduleSweep(gen uint64) {
	if g.opts.IdleTimeout < 0 {
		return
	}
	time.AfterFunc(g.sweepEvery(), func() { g.tellSelf(sweep{gen}) })
}

// tellSelf sends the gateway a message of its own, from any goroutine.
func (g *Gateway) tellSelf(m any) {
	if self := g.self.Load(); self != nil { // nil only before the actor started
		g.r.System().Root.Send(self, m)
	}
}

// sweep disconnects the clients that sent nothing for IdleTimeout and are
// in no room, or whose inbox was reported gone: each holds a Session and
// an Actor for nobody. A client in a room whose inbox is there reads it:
// it stays however long it is quiet.
func (g *Gateway) sweep() {
	now := time.Now()
	var idle []*client
	g.mu.Lock()
	for _, cl := range g.clients {
		if cl.leaving || cl.busy > 0 || now.Sub(cl.seen) < g.opts.IdleTimeout || (cl.room != "" && !cl.gone) {
			continue
		}
		cl.leaving = true
		idle = append(idle, cl)
	}
	g.mu.Unlock()
	if len(idle) == 0 {
		return
	}
	g.reaped.Add(uint64(len(idle)))
	if e := g.reapLog.limit(g.log.Info()); e != nil {
		e.Str("event", "clients_reaped").Int("clients", len(idle)).Dur("idle_timeout", g.opts.IdleTimeout).Uint64("reaped", g.reaped.Load()).Msg("idle clients were disconnected")
	}
	g.goSafe("reap", func() {
		// A few at a time: each is a Session close and an Actor delete.
		sem := make(chan struct{}, 16)
		var wg sync.WaitGroup
		for _, cl := range idle {
			g.r.System().Root.Send(cl.inbox, &chatpb.Disconnected{Reason: ErrIdle.Error()})
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				defer g.recoverPanic("reap")
				g.disconnect(cl)
			}()
		}
		wg.Wait()
	})
}

// relocate moves a room, or a user's Actor, to the named node, from this
// node whoever owns it (roam asks the owner).
func (g *Gateway) relocate(ctx context.Context, m *chatpb.Relocate) *chatpb.Relocated {
	out := &chatpb.Relocated{Room: clip(m.GetRoom()), To: clip(m.GetTo())}
	fail := func(err error) *chatpb.Relocated { out.Error = err.Error(); return out }
	if err := checkID("node", m.GetTo(), location.MaxIDBytes); err != nil {
		return fail(err)
	}
	ref := roam.UserSpotRef(m.GetRoom())
	if m.GetUser() != "" {
		if err := checkName(m.GetUser()); err != nil {
			return fail(err)
		}
		ref = roam.ActorRef(UserActor(m.GetUser()))
		out.Room = "@" + m.GetUser()
	} else if err := checkRoom(m.GetRoom()); err != nil {
		return fail(err)
	}
	o, err := g.r.Relocate(ctx, ref, m.GetTo())
	if err != nil {
		return fail(err)
	}
	nodes, err := g.r.Nodes(ctx)
	if err != nil {
		return fail(err)
	}
	for _, n := range nodes {
		if n.RID == o.From {
			out.From = n.Name
		}
	}
	if o.From == "" || o.From == o.To {
		out.From = out.To // already there
	}
	out.PauseMicros, out.Bytes = o.Pause.Microseconds(), o.Bytes
	return out
}

// logLimit lets one line of an event through per second: what any process
// can trigger at will (a refused or dropped request, a reap) must not
// flood the log. Each line says how many were left out since the last.
type logLimit struct {
	mu   sync.Mutex
	last time.Time
	left int
}

// limit is e with the count left out, or nil (nothing to write) when a
// line went out less than a second ago or e's level is off.
func (l *logLimit) limit(e *zerolog.Event) *zerolog.Event {
	if e == nil {
		return nil
	}
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.last.IsZero() && now.Sub(l.last) < time.Second {
		l.left++
		e.Discard()
		return nil
	}
	left := l.left
	l.last, l.left = now, 0
	return e.Int("not_logged_since", left)
}
