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
package chat

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/examples/chat/chatpb"
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

// Receive handles Join, Leave and Post; a Post is broadcast to every
// member's inbox and kept in the history.
func (r *Room) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *chatpb.Join:
		r.leave(m.GetMember().GetName())
		r.state.Members = append(r.state.Members, m.GetMember())
		c.Respond(&chatpb.Joined{Room: m.GetRoom(), History: r.state.History, Members: uint32(len(r.state.Members))})
	case *chatpb.Leave:
		r.leave(m.GetName())
		if c.Sender() != nil {
			c.Respond(&chatpb.Ack{})
		}
	case *chatpb.History:
		c.Respond(&chatpb.Joined{Room: m.GetRoom(), History: r.state.History, Members: uint32(len(r.state.Members))})
	case *chatpb.Post:
		p := &chatpb.Posted{Room: m.GetRoom(), Name: m.GetName(), Seq: m.GetSeq(), Text: m.GetText(), Index: r.state.NextIndex}
		r.state.NextIndex++
		r.state.History = append(r.state.History, p)
		if n := len(r.state.History); n > History {
			r.state.History = append([]*chatpb.Posted(nil), r.state.History[n-History:]...)
		}
		for _, mem := range r.state.Members {
			c.Send(inboxPID(mem.GetInbox()), p)
		}
		if c.Sender() != nil {
			c.Respond(&chatpb.Ack{})
		}
	}
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
		u.state.Session = m.GetSession()
	case *chatpb.Join:
		// Sent by the gateway once the Actor joined the room's Spot.
		u.state.Name = m.GetMember().GetName()
		m.Member = &chatpb.Member{Name: u.state.Name, Inbox: u.state.Session}
		reply, err := u.call(c, m.GetRoom(), m)
		if err != nil {
			reply = &chatpb.Ack{Error: err.Error()}
		} else {
			u.state.Room = m.GetRoom()
		}
		c.Respond(reply)
	case *chatpb.Post:
		if _, err := u.call(c, m.GetRoom(), m); err != nil {
			// Not lost quietly: the client hears of it.
			c.Send(inboxPID(u.state.Session), &chatpb.PostRefused{Room: m.GetRoom(), Name: m.GetName(), Seq: m.GetSeq(), Error: err.Error()})
		}
	case *chatpb.Leave:
		_, err := u.call(c, m.GetRoom(), m)
		if err == nil && m.GetRoom() == u.state.Room {
			u.state.Room = ""
		}
		if c.Sender() != nil {
			c.Respond(&chatpb.Ack{Error: errText(err)})
		}
	}
}

// call asks the room by its Spot ID and waits for the answer.
func (u *User) call(c actor.Context, room string, msg proto.Message) (proto.Message, error) {
	r := roam.Get(c.ActorSystem())
	if r == nil || r.Spots() == nil {
		return nil, fmt.Errorf("%w: roam is not running on this node", roamerr.ErrUnavailable)
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	// From: the placement director (when on) sees who talks to which room.
	reply, err := r.Spots().Request(room, msg).From(c).Do(ctx)
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

// Gateway serves chat clients on one node: each connected client has a
// Session here, whatever node its Actor and rooms are on.
type Gateway struct {
	r   *roam.Roam
	log zerolog.Logger
	// Timeout bounds each room call. Default 5 s.
	Timeout time.Duration

	mu      sync.Mutex
	clients map[string]*client
}

type client struct {
	name  string
	inbox *actor.PID
	s     *roam.Session
}

// StartGateway spawns the node's gateway actor on roam's actor system. It
// lives as long as the system: roam's node lifecycles come and go under it.
func StartGateway(r *roam.Roam, log zerolog.Logger) (*actor.PID, error) {
	g := &Gateway{r: r, log: log, Timeout: 5 * time.Second, clients: map[string]*client{}}
	return r.System().Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return g }), GatewayName)
}

func (g *Gateway) client(name string) *client {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.clients[name]
}

// Receive serves clients' commands. Posts and Leaves go into the client's
// Session in the order they arrive, so one client's posts reach its room
// in order; Connect, Join and Relocate are requests answered from their
// own goroutine.
func (g *Gateway) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *chatpb.Connect:
		sender := c.Sender()
		go func() { g.r.System().Root.Send(sender, g.connect(m)) }()
	case *chatpb.Post:
		if n := len(m.GetText()) + len(m.GetName()); n > MaxPostBytes {
			// Every member's inbox gets each post: one huge post would be
			// copied to all of them, and over a client's frame limit it
			// is not delivered at all.
			g.log.Warn().Str("event", "post_refused").Str("room", m.GetRoom()).Int("bytes", n).Msg("a post over MaxPostBytes was refused")
			if c.Sender() != nil {
				c.Respond(&chatpb.Ack{Error: fmt.Sprintf("a post may have at most %d bytes, this one has %d", MaxPostBytes, n)})
			}
			return
		}
		cl := g.client(m.GetName())
		var err error
		if cl == nil {
			err = fmt.Errorf("%q is not connected to this node", m.GetName())
		} else {
			err = cl.s.Send(UserActor(cl.name), m)
		}
		if err != nil {
			g.log.Warn().Str("event", "post_refused").Str("room", m.GetRoom()).Err(err).Msg("a post was not accepted")
			to := c.Sender()
			if to == nil && cl != nil {
				to = cl.inbox
			}
			if to != nil {
				c.Send(to, &chatpb.PostRefused{Room: m.GetRoom(), Name: m.GetName(), Seq: m.GetSeq(), Error: err.Error()})
			}
			return
		}
		if c.Sender() != nil {
			c.Respond(&chatpb.Ack{})
		}
	case *chatpb.Leave:
		cl := g.client(m.GetName())
		if cl == nil {
			return
		}
		if m.GetRoom() == "" {
			// Leaving without a room: the client goes.
			go g.disconnect(cl)
			return
		}
		if err := cl.s.Send(UserActor(cl.name), m); err != nil {
			g.log.Warn().Str("event", "leave_failed").Str("room", m.GetRoom()).Err(err).Msg("a leave was not accepted")
		}
	case *chatpb.Join:
		sender := c.Sender()
		go func() { g.r.System().Root.Send(sender, g.join(m)) }()
	case *chatpb.Relocate:
		sender := c.Sender()
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 3*g.Timeout)
			defer cancel()
			g.r.System().Root.Send(sender, g.relocate(ctx, m))
		}()
	case *chatpb.History:
		sender := c.Sender()
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), g.Timeout)
			defer cancel()
			reply, err := g.r.Spots().Request(m.GetRoom(), m).Do(ctx)
			if err != nil {
				reply = &chatpb.Ack{Error: err.Error()}
			}
			g.r.System().Root.Send(sender, reply)
		}()
	}
}

// connect opens the client's Session and spawns its Actor here, bound to
// it. A name connected before gets a new Actor: the old one is deleted.
func (g *Gateway) connect(m *chatpb.Connect) proto.Message {
	ctx, cancel := context.WithTimeout(context.Background(), g.Timeout)
	defer cancel()
	name := m.GetName()
	if name == "" || m.GetInbox() == nil {
		return &chatpb.Ack{Error: "a name and an inbox are required"}
	}
	inbox := inboxPID(m.GetInbox())
	cl := &client{name: name, inbox: inbox}
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
			g.mu.Unlock()
			// A connect that failed closes its Session itself: its client
			// got the error as the answer, not a disconnect.
			if err != nil && registered {
				g.log.Warn().Str("event", "client_disconnected").Str("name", name).Err(err).Msg("a client's session ended")
				g.r.System().Root.Send(inbox, &chatpb.Disconnected{Reason: err.Error()})
			}
		},
	})
	if err != nil {
		return &chatpb.Ack{Error: err.Error()}
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
		return &chatpb.Ack{Error: err.Error()}
	}
	g.mu.Lock()
	g.clients[name] = cl
	g.mu.Unlock()
	if err := s.Err(); err != nil {
		// It ended before it was registered: its OnClose told nobody.
		g.mu.Lock()
		if g.clients[name] == cl {
			delete(g.clients, name)
		}
		g.mu.Unlock()
		return &chatpb.Ack{Error: err.Error()}
	}
	return &chatpb.Connected{SessionId: string(s.ID()), Node: g.r.NodeName()}
}

// join makes the client's Actor a member of the room, created if need be:
// a cross-node Actor Join when the room lives on another node (the Actor
// moves there, its Session stays here). Then the Actor joins the room's
// member list, and the client gets the room's history.
func (g *Gateway) join(m *chatpb.Join) proto.Message {
	ctx, cancel := context.WithTimeout(context.Background(), 3*g.Timeout)
	defer cancel()
	cl := g.client(m.GetMember().GetName())
	if cl == nil {
		return &chatpb.Ack{Error: fmt.Sprintf("%q is not connected to this node", m.GetMember().GetName())}
	}
	res, err := g.r.Spots().GetOrCreate(m.GetRoom(), StableType).Do(ctx)
	if err != nil {
		return &chatpb.Ack{Error: err.Error()}
	}
	if _, err := g.r.JoinSpot(ctx, roam.ActorRef(UserActor(cl.name)), res.Ref); err != nil {
		return &chatpb.Ack{Error: err.Error()}
	}
	reply, err := cl.s.Request(ctx, UserActor(cl.name), m)
	if err != nil {
		return &chatpb.Ack{Error: err.Error()}
	}
	return reply
}

func (g *Gateway) disconnect(cl *client) {
	ctx, cancel := context.WithTimeout(context.Background(), g.Timeout)
	defer cancel()
	cl.s.Close()
	if _, err := g.r.DeleteActor(ctx, roam.ActorRef(UserActor(cl.name))); err != nil {
		g.log.Warn().Str("event", "user_delete_failed").Str("name", cl.name).Err(err).Msg("")
	}
}

// relocate moves a room, or a user's Actor, to the named node, from this
// node whoever owns it (roam asks the owner).
func (g *Gateway) relocate(ctx context.Context, m *chatpb.Relocate) *chatpb.Relocated {
	out := &chatpb.Relocated{Room: m.GetRoom(), To: m.GetTo()}
	fail := func(err error) *chatpb.Relocated { out.Error = err.Error(); return out }
	ref := roam.UserSpotRef(m.GetRoom())
	if m.GetUser() != "" {
		ref = roam.ActorRef(UserActor(m.GetUser()))
		out.Room = "@" + m.GetUser()
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
