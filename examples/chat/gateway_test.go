package chat_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/examples/chat"
	"github.com/roamactors/roam/examples/chat/chatpb"
	"github.com/roamactors/roam/internal/session"
	"github.com/roamactors/roam/internal/sessionhost"
	"github.com/roamactors/roam/internal/testlog"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// harness is one in-process chat node with its gateway, and a client's
// actor system reaching it over the remote, as a chat client does.
type harness struct {
	node   *roam.Roam
	gw     *actor.PID
	g      *chat.Gateway // nil: started by StartGateway
	client *actor.ActorSystem
	// failures are the node's actors' panics in their turn (recovered by
	// their supervisors, so only seen here).
	failures atomic.Int64
	failure  atomic.Value // the last one's reason
}

// newHarness starts the node and its gateway: with o, StartGatewayWith;
// without, StartGateway, as an application that sets nothing does.
func newHarness(t testing.TB, o *chat.GatewayOptions) *harness {
	t.Helper()
	ctx := context.Background()
	h := &harness{}
	system := actor.NewActorSystem()
	system.EventStream.Subscribe(func(evt any) {
		if e, ok := evt.(*actor.SupervisorEvent); ok {
			h.failures.Add(1)
			h.failure.Store(fmt.Sprintf("%v: %v", e.Child, e.Reason))
		}
	})
	r, err := roam.New(system, roam.WithStore(memstore.New()), roam.WithNodeName("solo"), roam.WithKinds(chat.Kinds()...),
		roam.WithLogger(*testlog.Logger()))
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx))
	t.Cleanup(func() {
		_ = r.Stop(ctx)
		system.Shutdown()
	})
	h.node = r
	if o == nil {
		h.gw, err = chat.StartGateway(r, *testlog.Logger())
	} else {
		h.g, h.gw, err = chat.StartGatewayWith(r, *testlog.Logger(), *o)
	}
	require.NoError(t, err)
	// The client's own PID of the gateway: Proto.Actor caches the process
	// a PID resolved to, and the client's is a remote one.
	h.gw = actor.NewPID(h.gw.Address, h.gw.Id)
	h.client = actor.NewActorSystem()
	rem := remote.NewRemote(h.client, remote.Configure("127.0.0.1", 0))
	rem.Start()
	t.Cleanup(func() { rem.Shutdown(false) })
	return h
}

// healthy fails t if an actor of the node panicked in its turn, or a
// gateway handler did on a goroutine (recovered and counted).
func (h *harness) healthy(t testing.TB) {
	t.Helper()
	require.Zero(t, h.failures.Load(), "an actor panicked: %v", h.failure.Load())
	if h.g != nil {
		require.Zero(t, h.g.Stats().Panics, "a gateway handler panicked (event gateway_panic)")
	}
}

// inbox spawns a client inbox that hands what it gets to got.
func (h *harness) inbox(got chan<- any) *actor.PID {
	return h.client.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if m, ok := c.Message().(proto.Message); ok && got != nil {
			select {
			case got <- m:
			default:
			}
		}
	}))
}

func wire(p *actor.PID) *messages.PID { return &messages.PID{Address: p.Address, Id: p.Id} }

func (h *harness) request(t testing.TB, msg proto.Message) any {
	t.Helper()
	res, err := h.client.Root.RequestFuture(h.gw, msg, 20*time.Second).Result()
	require.NoError(t, err, "the gateway answers %T", msg)
	return res
}

// serves checks the gateway answers each kind of request: a client
// connects, joins a room, posts, reads the history, moves the room and
// leaves.
func (h *harness) serves(t testing.TB, name string) {
	t.Helper()
	got := make(chan any, 64)
	inbox := h.inbox(got)
	res := h.request(t, &chatpb.Connect{Name: name, Inbox: wire(inbox)})
	require.IsType(t, &chatpb.Connected{}, res, "%v", res)
	res = h.request(t, &chatpb.Join{Room: "lobby", Member: &chatpb.Member{Name: name}})
	require.IsType(t, &chatpb.Joined{}, res, "%v", res)
	res = h.request(t, &chatpb.Post{Room: "lobby", Name: name, Seq: 1, Text: "hello"})
	require.Empty(t, res.(*chatpb.Ack).GetError())
	res = h.request(t, &chatpb.History{Room: "lobby"})
	require.IsType(t, &chatpb.Joined{}, res, "%v", res)
	res = h.request(t, &chatpb.Relocate{Room: "lobby", To: h.node.NodeName()})
	require.Empty(t, res.(*chatpb.Relocated).GetError())
	h.client.Root.Send(h.gw, &chatpb.Leave{Name: name}) // disconnects
}

// Every message the gateway handles, sent one-way (no sender to answer)
// and with fields missing, is dropped or served without an answer: the
// node does not crash (a panic on a goroutine of the gateway ends the
// process) and the gateway serves on.
func TestGatewayOneWayMessagesDoNotCrashIt(t *testing.T) {
	h := newHarness(t, nil)
	h.serves(t, "ann") // the lobby exists, ann is gone again
	got := make(chan any, 64)
	inbox := wire(h.inbox(got))
	oneWay := []proto.Message{
		&chatpb.Connect{}, &chatpb.Connect{Name: "ghost"}, &chatpb.Connect{Inbox: inbox},
		&chatpb.Connect{Name: "ghost", Inbox: &messages.PID{}}, &chatpb.Connect{Name: "ghost", Inbox: inbox},
		&chatpb.Join{}, &chatpb.Join{Room: "lobby"}, &chatpb.Join{Member: &chatpb.Member{}},
		&chatpb.Join{Room: "lobby", Member: &chatpb.Member{Name: "ghost"}}, &chatpb.Join{Room: "lobby", Member: &chatpb.Member{Name: "nobody"}},
		&chatpb.History{}, &chatpb.History{Room: "lobby"}, &chatpb.History{Room: "nowhere"},
		&chatpb.Relocate{}, &chatpb.Relocate{Room: "lobby"}, &chatpb.Relocate{Room: "lobby", To: h.node.NodeName()},
		&chatpb.Relocate{User: "ghost", To: "mars"},
		&chatpb.Post{}, &chatpb.Post{Room: "lobby"}, &chatpb.Post{Name: "ghost"}, &chatpb.Post{Room: "lobby", Name: "nobody", Text: "hi"},
		&chatpb.Leave{}, &chatpb.Leave{Room: "lobby"}, &chatpb.Leave{Name: "nobody"},
		// What the gateway answers with, sent to it: not its to handle.
		&chatpb.Ack{}, &chatpb.Connected{}, &chatpb.Joined{}, &chatpb.Posted{}, &chatpb.Relocated{},
		&chatpb.Disconnected{}, &chatpb.Recovered{}, &chatpb.PostRefused{}, &chatpb.Member{},
		&chatpb.RoomState{}, &chatpb.UserState{},
	}
	for _, m := range oneWay {
		h.client.Root.Send(h.gw, m)
	}
	// Each kind of request again, with a sender: each takes at least as
	// long as the one-way one of its kind before it, so a goroutine that
	// would crash the node has done so by the end.
	h.serves(t, "bo")
	h.serves(t, "cy")
	h.healthy(t)
}

// connect connects name with a new inbox that hands what it gets to got,
// and returns the answer and the inbox.
func (h *harness) connect(t testing.TB, name string, got chan<- any) (any, *actor.PID) {
	t.Helper()
	inbox := h.inbox(got)
	return h.request(t, &chatpb.Connect{Name: name, Inbox: wire(inbox)}), inbox
}

// A Connect past MaxClients is refused with ErrTooManyClients, and
// nothing is opened for it; a client connecting again under its name is
// not a new one; once a client leaves, a new one gets its place.
func TestGatewayRefusesClientsPastMaxClients(t *testing.T) {
	h := newHarness(t, &chat.GatewayOptions{MaxClients: 2, IdleTimeout: -1})
	for _, name := range []string{"ann", "bo"} {
		res, _ := h.connect(t, name, nil)
		require.IsType(t, &chatpb.Connected{}, res, "%v", res)
	}
	res, _ := h.connect(t, "cy", nil)
	require.IsType(t, &chatpb.Ack{}, res, "%v", res)
	require.Contains(t, res.(*chatpb.Ack).GetError(), chat.ErrTooManyClients.Error())
	require.EqualValues(t, 1, h.g.Stats().Refused)
	require.Equal(t, 2, h.g.Stats().Clients)
	_, err := h.node.Resolve(context.Background(), roam.ActorRef(chat.UserActor("cy")))
	require.ErrorIs(t, err, roamerr.ErrNotFound, "no Actor for a refused client")

	res, _ = h.connect(t, "ann", nil) // again, from a new inbox
	require.IsType(t, &chatpb.Connected{}, res, "%v", res)

	res = h.request(t, &chatpb.Leave{Name: "bo"})
	require.Empty(t, res.(*chatpb.Ack).GetError())
	testwait.For(t, func() bool { return h.g.Stats().Clients == 1 }, "bo's Session never closed")
	res, _ = h.connect(t, "cy", nil)
	require.IsType(t, &chatpb.Connected{}, res, "%v", res)
	h.healthy(t)
}

// released checks a client's Session and Actor are gone, as after a
// Leave: its Session's PID is no longer on the node, its Actor is deleted.
func (h *harness) released(t testing.TB, name, sessionID string) {
	t.Helper()
	testwait.For(t, func() bool {
		_, open := h.node.System().ProcessRegistry.GetLocal(sessionhost.PIDName(session.ID(sessionID)))
		return !open
	}, name+"'s Session was not closed")
	testwait.For(t, func() bool {
		_, err := h.node.Resolve(context.Background(), roam.ActorRef(chat.UserActor(name)))
		return errors.Is(err, roamerr.ErrNotFound)
	}, name+"'s Actor was not deleted")
}

// disconnected waits for a Disconnected in got and returns its reason.
func disconnected(t testing.TB, got <-chan any) string {
	t.Helper()
	deadline := time.After(testwait.Patience(t))
	for {
		select {
		case m := <-got:
			if d, ok := m.(*chatpb.Disconnected); ok {
				return d.GetReason()
			}
		case <-deadline:
			t.Fatal("no Disconnected came")
		}
	}
}

// A client that sends nothing for the idle timeout is disconnected, told
// why, and its Session and Actor released, when it is in no room or its
// inbox went away; a client reading a room through a live inbox stays,
// however quiet.
func TestGatewayReapsIdleClients(t *testing.T) {
	// Long enough for a client's Join to follow its Connect (a client
	// waiting for its Join is not idle), short enough to wait for.
	h := newHarness(t, &chat.GatewayOptions{IdleTimeout: 500 * time.Millisecond})
	// reader joins the lobby and reads it.
	readerGot := make(chan any, 64)
	res, _ := h.connect(t, "reader", readerGot)
	require.IsType(t, &chatpb.Connected{}, res, "%v", res)
	res = h.request(t, &chatpb.Join{Room: "lobby", Member: &chatpb.Member{Name: "reader"}})
	require.IsType(t, &chatpb.Joined{}, res, "%v", res)

	// squatter connects after reader last sent anything, and joins nothing.
	squatterGot := make(chan any, 64)
	res, _ = h.connect(t, "squatter", squatterGot)
	require.IsType(t, &chatpb.Connected{}, res, "%v", res)
	squatter := res.(*chatpb.Connected).GetSessionId()
	require.Contains(t, disconnected(t, squatterGot), chat.ErrIdle.Error())
	h.released(t, "squatter", squatter)
	// The sweep that found squatter idle found reader idle longer: it
	// stayed, being in a room with a live inbox.
	testwait.For(t, func() bool { return h.g.Stats().Clients == 1 }, "squatter is still counted")
	require.EqualValues(t, 1, h.g.Stats().Reaped)

	// gone joins the lobby, then its client goes away (its inbox stops).
	goneGot := make(chan any, 64)
	res, goneInbox := h.connect(t, "gone", goneGot)
	require.IsType(t, &chatpb.Connected{}, res, "%v", res)
	gone := res.(*chatpb.Connected).GetSessionId()
	res = h.request(t, &chatpb.Join{Room: "lobby", Member: &chatpb.Member{Name: "gone"}})
	require.IsType(t, &chatpb.Joined{}, res, "%v", res)
	h.client.Root.Stop(goneInbox)
	h.released(t, "gone", gone)
	testwait.For(t, func() bool { return h.g.Stats().Clients == 1 }, "gone is still counted")
	require.EqualValues(t, 2, h.g.Stats().Reaped)

	// reader is still connected, and was never told otherwise.
	res = h.request(t, &chatpb.Post{Room: "lobby", Name: "reader", Seq: 1, Text: "still here"})
	require.Empty(t, res.(*chatpb.Ack).GetError())
	for len(readerGot) > 0 {
		_, isDisconnected := (<-readerGot).(*chatpb.Disconnected)
		require.False(t, isDisconnected, "reader was disconnected")
	}
	h.healthy(t)
}

// fuzzText is a fuzzer's string as a protobuf string field must be (the
// client's marshalling refuses invalid UTF-8, and nothing else reaches
// the gateway).
func fuzzText(s string) string { return strings.ToValidUTF8(s, "?") }

// fuzzMessage builds one of the chat's messages from the fuzzer's
// choices: which type, which fields are set or nil, whose inbox, and
// raw bytes merged over it as its wire form.
func fuzzMessage(h *harness, inbox *actor.PID, kind, flags uint8, a, b, c string, seq uint64, raw []byte) proto.Message {
	a, b, c = fuzzText(a), fuzzText(b), fuzzText(c)
	// Names the fuzzer may pick from: one it made up, or one other inputs
	// use too (connected, or in a room, by an earlier input).
	pick := func(bit uint8, s string, known string) string {
		if flags&bit != 0 {
			return known
		}
		return s
	}
	name, room := pick(0x02, a, "ann"), pick(0x04, b, "lobby")
	// The inbox: none, empty, the client's, an actor the client does not
	// have, the node's own system, or an address nobody listens on.
	var pid *messages.PID
	switch (flags >> 3) & 0x07 {
	case 1:
		pid = &messages.PID{}
	case 2, 3:
		pid = wire(inbox)
	case 4:
		pid = &messages.PID{Address: inbox.Address, Id: c}
	case 5:
		pid = &messages.PID{Address: h.node.System().Address(), Id: c}
	case 6:
		pid = &messages.PID{Address: "127.0.0.1:1", Id: c}
	}
	var member *chatpb.Member
	if flags&0x40 != 0 {
		member = &chatpb.Member{Name: name, Inbox: pid}
	}
	var m proto.Message
	switch kind % 16 {
	case 0:
		m = &chatpb.Connect{Name: name, Inbox: pid}
	case 1:
		m = &chatpb.Join{Room: room, Member: member}
	case 2:
		m = &chatpb.Post{Room: room, Name: name, Seq: seq, Text: c}
	case 3:
		m = &chatpb.Leave{Room: room, Name: name}
	case 4:
		m = &chatpb.Leave{Name: name}
	case 5:
		m = &chatpb.History{Room: room}
	case 6:
		m = &chatpb.Relocate{Room: room, To: pick(0x40, c, h.node.NodeName())}
	case 7:
		m = &chatpb.Relocate{User: name, To: pick(0x40, c, h.node.NodeName())}
	case 8:
		m = &chatpb.Joined{Room: room, Members: uint32(seq)}
	case 9:
		m = &chatpb.Ack{Error: c}
	case 10:
		m = &chatpb.Disconnected{Reason: c}
	case 11:
		m = &chatpb.Posted{Room: room, Name: name, Seq: seq, Text: c}
	case 12:
		m = &chatpb.Member{Name: name, Inbox: pid}
	case 13:
		m = &chatpb.RoomState{Members: []*chatpb.Member{member}}
	case 14:
		m = &chatpb.UserState{Name: name, Room: room, Session: pid}
	default:
		m = &chatpb.Connected{SessionId: c, Node: name}
	}
	if flags&0x80 != 0 {
		// Whatever the bytes decode to on top (an error leaves a part).
		_ = proto.UnmarshalOptions{Merge: true}.Unmarshal(raw, m)
	}
	return m
}

// handled are the messages the gateway answers when they have a sender.
func handled(m proto.Message) bool {
	switch m.(type) {
	case *chatpb.Connect, *chatpb.Join, *chatpb.Post, *chatpb.Leave, *chatpb.History, *chatpb.Relocate:
		return true
	}
	return false
}

// FuzzGateway delivers the chat's messages, with fields missing, nil,
// oversized or made up, with and without a sender, over the remote to a
// running gateway that has few client places and reaps idle clients
// quickly: nothing panics (in a goroutine that would end the fuzzer's
// process; in an actor's turn its supervisor would see it), every request
// with a sender is answered, and the gateway still answers a plain
// request after each.
func FuzzGateway(f *testing.F) {
	h := newHarness(f, &chat.GatewayOptions{MaxClients: 8, IdleTimeout: 50 * time.Millisecond, Timeout: 2 * time.Second})
	// The lobby, which every input's check reads. Clients come and go with
	// the inputs (those naming "ann" connect, join and leave as one).
	_, err := h.node.Spots().GetOrCreate(context.Background(), "lobby", chat.StableType)
	require.NoError(f, err)
	inbox := h.inbox(nil)
	for kind := uint8(0); kind < 16; kind++ {
		for _, flags := range []uint8{0x00, 0x01, 0x17, 0x16, 0x5f, 0x27, 0x36, 0x2e} {
			f.Add(kind, flags, "bo", "hall", "hello", uint64(1), []byte(nil))
		}
	}
	f.Add(uint8(0), uint8(0x81), "", "", "", uint64(0), []byte{0x12, 0x00})                   // Connect{Inbox: {}}
	f.Add(uint8(1), uint8(0x81), "", "", "", uint64(0), []byte{0x12, 0x02, 0x12, 0x00})       // Join{Member: {Inbox: {}}}
	f.Add(uint8(2), uint8(0x07), "", "", strings.Repeat("x", 70<<10), uint64(2), []byte(nil)) // a post over MaxPostBytes
	f.Add(uint8(0), uint8(0x11), strings.Repeat("n", 300), "", "", uint64(0), []byte(nil))    // a name over MaxNameBytes
	f.Fuzz(func(t *testing.T, kind, flags uint8, a, b, c string, seq uint64, raw []byte) {
		m := fuzzMessage(h, inbox, kind, flags, a, b, c, seq, raw)
		switch {
		case flags&0x01 != 0 && handled(m):
			res, err := h.client.Root.RequestFuture(h.gw, m, testwait.Patience(t)).Result()
			require.NoError(t, err, "no answer to %T %v", m, m)
			require.NotNil(t, res)
		case flags&0x01 != 0:
			h.client.Root.RequestWithCustomSender(h.gw, m, inbox) // none expected
		default:
			h.client.Root.Send(h.gw, m)
		}
		res := h.request(t, &chatpb.History{Room: "lobby"})
		require.IsType(t, &chatpb.Joined{}, res, "%v", res)
		h.healthy(t)
	})
}
