package meshnode

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/ratelog"
)

// Limits bound what peers, members or not, can make a node hold through
// its remote port (docs/SECURITY.md). A zero field takes its default.
type Limits struct {
	// MaxConnections bounds the peer connections a node holds at once;
	// one past it is closed as it arrives (remote_connection_refused).
	// Default 1,024: a node has one connection from each peer node and
	// each client. With TLS, connections whose certificate names a roam
	// node and those whose certificate names none (clients) have a limit
	// each, so clients cannot take the nodes' connections.
	MaxConnections int
	// MaxStreamsPerConnection bounds the streams a peer may open on one
	// connection (Proto.Actor opens one). Default 16.
	MaxStreamsPerConnection uint32
	// FirstFrameTimeout is how long a new connection may take for its
	// handshake, and a new stream for its first frame, before it is
	// closed. Default 10 s.
	FirstFrameTimeout time.Duration
	// IdleConnection closes a connection that has had no stream for this
	// long. Default 2 minutes.
	IdleConnection time.Duration
	// MaxRemoteWatches bounds the watches peers hold on this node's
	// actors (actor.Watch from another process), and
	// MaxRemoteWatchesPerPeer those of one peer (its certificate with
	// TLS, else the address it connects as); a watch past either is
	// dropped (remote_message_refused). A watch lasts as long as the
	// connection that brought it. Defaults 16,384 and 1,024.
	MaxRemoteWatches, MaxRemoteWatchesPerPeer int
}

func (l Limits) withDefaults() Limits {
	if l.MaxConnections <= 0 {
		l.MaxConnections = 1024
	}
	if l.MaxStreamsPerConnection == 0 {
		l.MaxStreamsPerConnection = 16
	}
	if l.FirstFrameTimeout <= 0 {
		l.FirstFrameTimeout = 10 * time.Second
	}
	if l.IdleConnection <= 0 {
		l.IdleConnection = 2 * time.Minute
	}
	if l.MaxRemoteWatches <= 0 {
		l.MaxRemoteWatches = 16384
	}
	if l.MaxRemoteWatchesPerPeer <= 0 {
		l.MaxRemoteWatchesPerPeer = 1024
	}
	return l
}

// serverLimits are the gRPC server options that hold Limits: the
// handshake timeout, streams per connection, idle connections, and pings
// that find a peer gone without a word (a crash, a cut: its connection
// would otherwise count for hours).
func serverLimits(l Limits) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ConnectionTimeout(l.FirstFrameTimeout),
		grpc.MaxConcurrentStreams(l.MaxStreamsPerConnection),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: l.IdleConnection, Time: 30 * time.Second, Timeout: 10 * time.Second}),
	}
}

// countingCreds are creds (plain TCP for nil) that also count the
// connections (Limits.MaxConnections): the handshake is the one place
// gRPC shows a node each new connection.
func countingCreds(l Limits, creds credentials.TransportCredentials, counts *refusals, log zerolog.Logger) grpc.ServerOption {
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	return grpc.Creds(&countedCreds{TransportCredentials: creds, max: int64(l.MaxConnections), counts: counts, log: log, handshaking: map[string]int{}})
}

// refusals counts what the transport refused, by cause, for tests and
// Refusals.
type refusals struct {
	connections, streams, watches, messages atomic.Int64
}

// Refusals are the transport's refusals so far.
type Refusals struct {
	// Connections refused past MaxConnections; Streams ended without a
	// first frame in time; Watches dropped; Messages dropped from a
	// stream that goes on (remote_message_refused, watches among them).
	Connections, Streams, Watches, Messages int64
}

// ErrTooManyConnections is the handshake error of a connection past
// Limits.MaxConnections.
var ErrTooManyConnections = errors.New("the node holds as many connections as it takes")

var connectionRefusedLog ratelog.Limiter

// countedCreds are a server's transport credentials that also count its
// connections, refusing one past max: with TLS, max for connections whose
// certificate names a roam node and max for the others; and at most
// maxHandshakesPerHost handshakes at once from one host, so that a process
// without a certificate, stalling its handshakes, cannot take the nodes'
// connections either.
type countedCreds struct {
	credentials.TransportCredentials
	max    int64
	open   atomic.Int64 // connections, handshaking or established
	nodes  atomic.Int64 // established, with a certificate naming a node
	others atomic.Int64 // established, any other
	counts *refusals
	log    zerolog.Logger

	mu          sync.Mutex
	handshaking map[string]int // by the peer's host
}

// maxHandshakesPerHost bounds the handshakes in progress from one host.
const maxHandshakesPerHost = 64

func (c *countedCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	host, _, _ := net.SplitHostPort(raw.RemoteAddr().String())
	c.mu.Lock()
	busy := c.handshaking[host] >= maxHandshakesPerHost
	if !busy {
		c.handshaking[host]++
	}
	c.mu.Unlock()
	if busy {
		return nil, nil, c.refuse(raw, "handshakes")
	}
	defer func() {
		c.mu.Lock()
		if c.handshaking[host]--; c.handshaking[host] <= 0 {
			delete(c.handshaking, host)
		}
		c.mu.Unlock()
	}()
	if c.open.Add(1) > 2*c.max {
		c.open.Add(-1)
		return nil, nil, c.refuse(raw, "")
	}
	conn, auth, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		c.open.Add(-1)
		return nil, nil, err
	}
	class := &c.others
	if info, ok := auth.(credentials.TLSInfo); ok && len(info.State.PeerCertificates) > 0 && len(certNodes(info.State.PeerCertificates[0])) > 0 {
		class = &c.nodes
	}
	if class.Add(1) > c.max {
		class.Add(-1)
		c.open.Add(-1)
		return nil, nil, c.refuse(conn, map[bool]string{true: "nodes", false: "others"}[class == &c.nodes])
	}
	return &countedConn{Conn: conn, creds: c, class: class}, auth, nil
}

func (c *countedCreds) refuse(conn net.Conn, class string) error {
	c.counts.connections.Add(1)
	connectionRefusedLog.Warn(&c.log).Str("event", "remote_connection_refused").Str("peer", conn.RemoteAddr().String()).
		Str("class", class).Int64("limit", c.max).Msg("a connection past the node's limit was closed")
	_ = conn.Close()
	return ErrTooManyConnections
}

func (c *countedCreds) Clone() credentials.TransportCredentials {
	return &countedCreds{TransportCredentials: c.TransportCredentials.Clone(), max: c.max, counts: c.counts, log: c.log, handshaking: map[string]int{}}
}

type countedConn struct {
	net.Conn
	creds *countedCreds
	class *atomic.Int64
	once  sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() {
		c.class.Add(-1)
		c.creds.open.Add(-1)
	})
	return c.Conn.Close()
}

// firstFrame reads a stream's first frame within timeout: a stream a
// peer opens and never sends on would otherwise hold its goroutines and
// buffers for as long as the connection lives. Ending the handler ends
// the stream, which ends the read left behind.
func firstFrame(ctx context.Context, ss grpc.ServerStream, m any, timeout time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- ss.RecvMsg(m) }()
	fire, t := machine.NewTimer(machine.Real, timeout) // a socket's timeout: real time
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-fire:
		return errNoFirstFrame
	case <-ctx.Done():
		return ctx.Err()
	}
}

var errNoFirstFrame = errors.New("no first frame in time")

// TransportRefusals are what the node's transport refused so far.
func (n *Node) TransportRefusals() Refusals {
	c := &n.link.hooks.counts
	return Refusals{Connections: c.connections.Load(), Streams: c.streams.Load(), Watches: c.watches.Load(), Messages: c.messages.Load()}
}

// RemoteWatches is how many watches other processes hold on this node's
// actors.
func (n *Node) RemoteWatches() int { return n.link.hooks.watches.count() }
