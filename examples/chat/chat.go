// Package chat is roam's example application: chat rooms that are Instance
// Spots, so a room keeps its members and its last 100 posts while it moves
// between nodes and people keep talking.
//
// A room is activated by the first message with Instance intent (a Join or
// a Post) and moves with PreserveStateWith. Clients are not roam nodes: they
// talk to a node's Gateway ("chat/gateway"), which reaches rooms by Spot ID
// through the node's Spot manager, and receive Posted messages in an inbox
// actor of their own. Relocate moves a room to a node by its name
// (roam.WithNodeName, the node's --name), from any node.
package chat

import (
	"context"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/examples/chat/chatpb"
	"github.com/roamactors/roam/messages"
)

// StableType is the rooms' kind.
const StableType = "room"

// History is how many posts a room keeps and moves.
const History = 100

// MaxPostBytes bounds a post's text and name: a room keeps History posts
// and moves them, and sends each to every member.
const MaxPostBytes = 64 << 10

// GatewayName is the PID id of every chat node's gateway.
const GatewayName = "chat/gateway"

// Kind is the rooms' relocatable kind: an Instance Spot type whose state
// moves with it.
func Kind() roam.Kind {
	// A room whose node crashed comes back empty (members rejoin as they
	// post) instead of waiting for an operator: ReactivateEmpty.
	return roam.NewKind(StableType, actor.PropsFromProducer(func() actor.Actor { return &Room{} }),
		roam.PreserveStateWith(roomState{}), roam.Instance(), roam.ReactivateEmpty())
}

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

// Gateway serves chat clients on one node.
type Gateway struct {
	r   *roam.Roam
	log zerolog.Logger
	// Timeout bounds each room call. Default 5 s.
	Timeout time.Duration
}

// StartGateway spawns the node's gateway actor on roam's actor system. It
// lives as long as the system: roam's node lifecycles come and go under it.
func StartGateway(r *roam.Roam, log zerolog.Logger) (*actor.PID, error) {
	g := &Gateway{r: r, log: log, Timeout: 5 * time.Second}
	return r.System().Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return g }), GatewayName)
}

// Receive forwards clients' commands to rooms. Posts and Leaves are sent in
// the order they arrive, so one client's posts reach its room in order;
// Joins and Relocates are requests answered from their own goroutine.
func (g *Gateway) Receive(c actor.Context) {
	ctx, cancel := context.WithTimeout(context.Background(), g.Timeout)
	switch m := c.Message().(type) {
	case *chatpb.Post:
		defer cancel()
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
		if _, err := g.r.Spots().Send(m.GetRoom(), m).InstanceSpot(StableType).Do(ctx); err != nil {
			g.log.Warn().Str("event", "post_failed").Str("room", m.GetRoom()).Err(err).Msg("a post was not delivered to its room")
		}
	case *chatpb.Leave:
		defer cancel()
		if _, err := g.r.Spots().Send(m.GetRoom(), m).Do(ctx); err != nil {
			g.log.Warn().Str("event", "leave_failed").Str("room", m.GetRoom()).Err(err).Msg("a leave was not delivered")
		}
	case *chatpb.Join:
		sender := c.Sender()
		go func() {
			defer cancel()
			reply, err := g.r.Spots().Request(m.GetRoom(), m).InstanceSpot(StableType).Do(ctx)
			if err != nil {
				reply = &chatpb.Ack{Error: err.Error()}
			}
			g.r.System().Root.Send(sender, reply)
		}()
	case *chatpb.Relocate:
		sender := c.Sender()
		go func() {
			defer cancel()
			g.r.System().Root.Send(sender, g.relocate(ctx, m))
		}()
	default:
		cancel()
	}
}

// relocate moves a room to the named node, from this node whoever owns
// it (roam asks the owner).
func (g *Gateway) relocate(ctx context.Context, m *chatpb.Relocate) *chatpb.Relocated {
	out := &chatpb.Relocated{Room: m.GetRoom(), To: m.GetTo()}
	fail := func(err error) *chatpb.Relocated { out.Error = err.Error(); return out }
	ref, err := g.r.Spots().Find(ctx, m.GetRoom())
	if err != nil {
		return fail(err)
	}
	nodes, err := g.r.Nodes(ctx)
	if err != nil {
		return fail(err)
	}
	for _, n := range nodes {
		if n.RID == ref.NodeRid {
			out.From = n.Name
			if n.Name == m.GetTo() {
				return out // already there
			}
		}
	}
	o, err := g.r.Relocate(ctx, roam.InstanceSpotRef(m.GetRoom()), m.GetTo())
	if err != nil {
		return fail(err)
	}
	out.PauseMicros, out.Bytes = o.Pause.Microseconds(), o.Bytes
	return out
}
