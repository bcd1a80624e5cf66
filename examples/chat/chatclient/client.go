// Package chatclient is a chat client: what cmd/chat-client runs, as a
// library a program (or a test) drives. A Client reaches one node's
// gateway (examples/chat), which holds the client's Session; everything
// it sends goes through that node.
//
// What a terminal user most needs from it is to hear when something did
// not work: a dead address fails Dial within DialTimeout, naming the
// address; every post is answered by the gateway (accepted, or why not),
// and one the room refuses later arrives as a PostRefused; once the node
// goes away (stopped or killed: the connection ends; cut off: a request
// goes unanswered for Config.Timeout) or ends the client's Session, Done
// is closed, Err says why, and every later call fails with that error at
// once instead of vanishing into a connection that no longer exists.
package chatclient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/examples/chat"
	"github.com/roamactors/roam/examples/chat/chatpb"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Defaults of Config.
const (
	// DefaultDialTimeout bounds the first TCP connection to the node: a
	// node on a reachable network accepts within milliseconds, and a
	// user waiting at a terminal wants to hear of a wrong address soon.
	DefaultDialTimeout = 2 * time.Second
	// DefaultTimeout bounds each request: above the gateway's own bound
	// on a Join or a Relocate (three times chat.DefaultTimeout), so that
	// its answer, even a failure, arrives first.
	DefaultTimeout = 20 * time.Second
)

// The errors of a Client, each in a roam error class.
var (
	// ErrUnreachable: no chat gateway answers at the address.
	ErrUnreachable = fmt.Errorf("chatclient: no chat node reached: %w", roamerr.ErrUnavailable)
	// ErrNodeGone: the node the client is connected to went away (it
	// stopped, ended or cannot be reached any more). Its Session went with
	// it: connect again, to it once it is back or to another node.
	ErrNodeGone = fmt.Errorf("chatclient: the chat node this client is connected to is gone: %w", roamerr.ErrUnavailable)
	// ErrDisconnected: the gateway ended the client's Session (its reason
	// follows); the client may connect again.
	ErrDisconnected = fmt.Errorf("chatclient: disconnected by the chat node: %w", roamerr.ErrUnavailable)
	// ErrClosed: Close was called.
	ErrClosed = fmt.Errorf("chatclient: the client is closed: %w", roamerr.ErrUnavailable)
)

// Config is what a Client connects to, and as whom.
type Config struct {
	// Node is the address (host:port) of the chat node whose gateway the
	// client talks to: a chat-node's --listen address.
	Node string
	// TLS: the cluster's mutual TLS (a client certificate naming the
	// client's host); nil for plain TCP.
	TLS *roam.TLS
	// DialTimeout bounds Dial's TCP connection to Node. Default
	// DefaultDialTimeout.
	DialTimeout time.Duration
	// Timeout bounds each request to the gateway. Default DefaultTimeout.
	Timeout time.Duration
	// OnEvent, if set, gets what the node pushes to the client:
	// *chatpb.Posted, *chatpb.PostRefused and *chatpb.Recovered, one at a
	// time, in the order they arrive. It must not block for long: the
	// client's inbox waits for it.
	OnEvent func(proto.Message)
}

// Client is one connection to a chat node's gateway.
type Client struct {
	cfg     Config
	sys     *actor.ActorSystem
	rem     *remote.Remote
	gateway *actor.PID
	inbox   *actor.PID
	seq     atomic.Uint64

	closeOnce sync.Once

	mu   sync.Mutex
	name string // set by Connect
	node string // the node's name, from Connected
	err  error  // why the client can no longer chat; nil while it can
	done chan struct{}
}

// Dial reaches the chat node at cfg.Node. Nothing listening there, or
// nothing within cfg.DialTimeout (or ctx), fails with ErrUnreachable
// naming the address. A listener that is no chat node (or speaks TLS
// where the client does not, or the other way round) is found out by
// the first request, Connect or Relocate.
func Dial(ctx context.Context, cfg Config) (*Client, error) {
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if _, _, err := net.SplitHostPort(cfg.Node); err != nil {
		return nil, fmt.Errorf("%w: the node's address %q is not host:port: %v", ErrUnreachable, cfg.Node, err)
	}
	// Proto.Actor alone would take ten seconds (five connection attempts
	// two seconds apart) to give up on a dead address, and then say only
	// that a request timed out: a plain TCP connection tells at once.
	d := net.Dialer{Timeout: cfg.DialTimeout}
	conn, err := d.DialContext(ctx, "tcp", cfg.Node)
	if err != nil {
		return nil, fmt.Errorf("%w: nothing answers at %s (%v): check that a chat node runs there and that the address is its --listen address",
			ErrUnreachable, cfg.Node, err)
	}
	// The node sends the client's pushes back to the client's own remote:
	// it listens on the local address that reached the node, which the
	// node can reach in turn.
	host := conn.LocalAddr().(*net.TCPAddr).IP.String()
	_ = conn.Close()
	opts, err := roam.ClientRemoteOptions(cfg.TLS, host)
	if err != nil {
		return nil, err
	}
	// Proto.Actor's own logs (connection chatter) stay out of the chat.
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError + 4}))
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet }))
	rcfg := remote.Configure(host, 0, opts...)
	// One connection attempt, not five: a node that refuses the
	// connection now (TLS on one side only, or gone since the dial above)
	// is reported as gone two seconds later, not ten.
	rcfg.MaxRetryCount = 1
	rem := remote.NewRemote(sys, rcfg)
	rem.Start()
	c := &Client{cfg: cfg, sys: sys, rem: rem, gateway: actor.NewPID(cfg.Node, chat.GatewayName), done: make(chan struct{})}
	// The inbox watches the gateway: Proto.Actor tells a watcher when the
	// watched actor stops and, for a remote one, when the connection to
	// its process ends, which is how a client hears that its node went
	// away without a word (killed, or stopped before it could say so).
	c.inbox = sys.Root.Spawn(actor.PropsFromFunc(c.receive))
	return c, nil
}

// receive is the client's inbox.
func (c *Client) receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		ctx.Watch(c.gateway)
	case *actor.Terminated:
		if m.GetWho().GetAddress() == c.gateway.GetAddress() && m.GetWho().GetId() == c.gateway.GetId() {
			why := "its gateway stopped"
			if m.GetWhy() == actor.TerminatedReason_AddressTerminated {
				why = "the connection to it ended: it stopped, was killed or cannot be reached"
			}
			c.end(fmt.Errorf("%w: %s at %s: %s; connect again, to it once it is back or to another node", ErrNodeGone, c.nodeName(), c.cfg.Node, why))
		}
	case *chatpb.Disconnected:
		c.end(fmt.Errorf("%w: %s", ErrDisconnected, m.GetReason()))
	case *chatpb.Posted, *chatpb.PostRefused, *chatpb.Recovered:
		if c.cfg.OnEvent != nil {
			c.cfg.OnEvent(m.(proto.Message))
		}
	}
}

// nodeName names the node for a message: its name once connected.
func (c *Client) nodeName() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.node != "" {
		return "node " + c.node
	}
	return "the node"
}

// end records why the client can no longer chat; the first reason stays.
func (c *Client) end(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
		close(c.done)
	}
}

// Done is closed once the client can no longer chat: its node went away,
// the node ended its Session, or Close was called. Err says which.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err is why Done is closed (ErrNodeGone, ErrDisconnected or ErrClosed,
// wrapped with the details); nil before.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Node is the name of the node the client is connected to ("" before
// Connect).
func (c *Client) Node() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.node
}

// request asks the gateway and waits for its answer, for the end of ctx,
// or for the client's end, whichever comes first.
func (c *Client) request(ctx context.Context, what string, msg proto.Message) (proto.Message, error) {
	if err := c.Err(); err != nil {
		return nil, err
	}
	timeout, cut := c.cfg.Timeout, false
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout, cut = time.Until(dl), true // the caller's deadline comes first
	}
	if timeout <= 0 {
		return nil, fmt.Errorf("%s: %w", what, context.DeadlineExceeded)
	}
	f := c.sys.Root.RequestFuture(c.gateway, msg, timeout)
	type result struct {
		res any
		err error
	}
	got := make(chan result, 1)
	go func() {
		res, err := f.Result()
		got <- result{res, err}
	}()
	var r result
	select {
	case r = <-got:
	case <-c.done:
		return nil, c.Err()
	case <-ctx.Done():
		return nil, fmt.Errorf("%s: %w", what, ctx.Err())
	}
	switch {
	case r.err == nil:
	case errors.Is(r.err, actor.ErrTimeout):
		if err := c.Err(); err != nil {
			return nil, err // it went away meanwhile: that is the news
		}
		if cut {
			return nil, fmt.Errorf("%s: %w", what, context.DeadlineExceeded)
		}
		if name, _ := c.connectedName(); name != "" {
			// The gateway answers every request within its own bounds, a
			// post at once: no answer at all is a node cut off or stopped
			// in a way no connection's end reported (a network cut shows
			// only so). Waiting on would leave the client posting into
			// nothing.
			c.end(fmt.Errorf("%w: %s at %s did not answer the %s within %s: it stopped, or is cut off or overloaded; connect again, to it once it answers or to another node",
				ErrNodeGone, c.nodeName(), c.cfg.Node, what, timeout))
			return nil, c.Err()
		}
		return nil, fmt.Errorf("%w: no answer to the %s from a chat gateway at %s within %s: check that the address is a chat node's and that TLS is on at both ends or at neither",
			ErrUnreachable, what, c.cfg.Node, timeout)
	case errors.Is(r.err, actor.ErrDeadLetter):
		return nil, fmt.Errorf("%w: no chat gateway at %s took the %s (a process there that is no chat node, or one whose gateway stopped)", ErrUnreachable, c.cfg.Node, what)
	default:
		return nil, fmt.Errorf("%s: %w", what, r.err)
	}
	m, ok := r.res.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%w: the gateway at %s answered the %s with %T", roamerr.ErrInvalidOperation, c.cfg.Node, what, r.res)
	}
	if a, ok := m.(*chatpb.Ack); ok && a.GetError() != "" {
		return nil, fmt.Errorf("%s: %s", what, a.GetError())
	}
	return m, nil
}

// Connect connects to the gateway as name: the node opens a Session for
// the client and spawns the user's Actor, bound to it.
func (c *Client) Connect(ctx context.Context, name string) error {
	res, err := c.request(ctx, "connect", &chatpb.Connect{Name: name, Inbox: &messages.PID{Address: c.inbox.Address, Id: c.inbox.Id}})
	if err != nil {
		return err
	}
	cn, ok := res.(*chatpb.Connected)
	if !ok {
		return fmt.Errorf("%w: the gateway at %s answered a connect with %T", roamerr.ErrInvalidOperation, c.cfg.Node, res)
	}
	c.mu.Lock()
	c.name, c.node = name, cn.GetNode()
	c.mu.Unlock()
	return nil
}

func (c *Client) connectedName() (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.name == "" {
		return "", fmt.Errorf("%w: not connected (Connect first)", roamerr.ErrInvalidOperation)
	}
	return c.name, nil
}

// Join joins the room (created if need be) and answers its last posts.
func (c *Client) Join(ctx context.Context, room string) (*chatpb.Joined, error) {
	name, err := c.connectedName()
	if err != nil {
		return nil, err
	}
	res, err := c.request(ctx, "join", &chatpb.Join{Room: room, Member: &chatpb.Member{Name: name}})
	if err != nil {
		return nil, err
	}
	j, ok := res.(*chatpb.Joined)
	if !ok {
		return nil, fmt.Errorf("%w: the gateway at %s answered a join with %T", roamerr.ErrInvalidOperation, c.cfg.Node, res)
	}
	return j, nil
}

// Post posts text to the room and returns its sequence number. A nil
// error means the node took the post into the client's Session; a room
// that refuses it later says so with a PostRefused of that number
// (Config.OnEvent). Any other outcome is an error: a post never goes
// silently nowhere.
func (c *Client) Post(ctx context.Context, room, text string) (uint64, error) {
	name, err := c.connectedName()
	if err != nil {
		return 0, err
	}
	seq := c.seq.Add(1)
	_, err = c.request(ctx, "post", &chatpb.Post{Room: room, Name: name, Seq: seq, Text: text})
	return seq, err
}

// Relocate moves a room (m.Room), or a user's Actor (m.User), to the
// node m.To names. The answer's Error is returned as the error.
func (c *Client) Relocate(ctx context.Context, m *chatpb.Relocate) (*chatpb.Relocated, error) {
	res, err := c.request(ctx, "move", m)
	if err != nil {
		return nil, err
	}
	r, ok := res.(*chatpb.Relocated)
	if !ok {
		return nil, fmt.Errorf("%w: the gateway at %s answered a move with %T", roamerr.ErrInvalidOperation, c.cfg.Node, res)
	}
	if r.GetError() != "" {
		return r, fmt.Errorf("move: %s", r.GetError())
	}
	return r, nil
}

// Leave takes the client out of the room.
func (c *Client) Leave(ctx context.Context, room string) error {
	name, err := c.connectedName()
	if err != nil {
		return err
	}
	_, err = c.request(ctx, "leave", &chatpb.Leave{Room: room, Name: name})
	return err
}

// Close disconnects the client, if it is connected and its node is still
// there (the node releases its Session and Actor before it answers), and
// stops its remote. Done is closed after it, with ErrClosed unless the
// client had ended before. Later calls do nothing.
func (c *Client) Close(ctx context.Context) error {
	var err error
	c.closeOnce.Do(func() {
		if name, _ := c.connectedName(); name != "" && c.Err() == nil {
			_, err = c.request(ctx, "disconnect", &chatpb.Leave{Name: name})
		}
		c.end(ErrClosed)
		c.rem.Shutdown(false)
		c.sys.Shutdown()
	})
	return err
}
