package meshnode

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/roamactors/roam/internal/ask"
	"github.com/roamactors/roam/internal/failure"
	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/ratelog"
)

// ControlActors are the names of roam's per-node service actors, the
// only receivers of roam's control messages (the relocation driver, the
// Spot service and the Session owner). A control message is never forwarded, so its
// declared sender must be on a host the connection's certificate names.
var ControlActors = []string{"roam/relocation", "roam/spot", "roam/session"}

// remoteOptions completes the remote configuration built from the
// application's RemoteOptions with roam's own: the frame limits and the
// server guards first, so the application's options add to them instead
// of dropping them (an option given later wins); with TLS, the transport
// credentials last, so nothing an application passes can turn them off.
func remoteOptions(rcfg *remote.Config, log zerolog.Logger, sys *actor.ActorSystem, hooks *remoteHooks, server, client credentials.TransportCredentials) {
	tlsOn := server != nil
	own := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxFrameBytes), grpc.MaxSendMsgSize(MaxFrameBytes),
		grpc.ChainUnaryInterceptor(guardUnary(log)), grpc.ChainStreamInterceptor(guardStream(log, tlsOn, sys, hooks)),
		grpc.InitialWindowSize(remoteWindowBytes), grpc.InitialConnWindowSize(remoteWindowBytes),
	}
	// The limits come first, so that an application's own options win;
	// without TLS the counting credentials too, so that its own
	// credentials (its own TLS) still win.
	own = append(own, serverLimits(hooks.limits)...)
	if !tlsOn {
		own = append(own, countingCreds(hooks.limits, nil, &hooks.counts, log))
	}
	rcfg.ServerOptions = append(own, rcfg.ServerOptions...)
	checkRequestSizes(sys, log)
	rcfg.DialOptions = append([]grpc.DialOption{
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(MaxFrameBytes), grpc.MaxCallRecvMsgSize(MaxFrameBytes)),
		grpc.WithChainStreamInterceptor(splitFrames(log, sys, hooks.limitOf)),
		grpc.WithInitialWindowSize(remoteWindowBytes), grpc.WithInitialConnWindowSize(remoteWindowBytes),
	}, rcfg.DialOptions...)
	rcfg.CallOptions = append([]grpc.CallOption{grpc.MaxCallSendMsgSize(MaxFrameBytes), grpc.MaxCallRecvMsgSize(MaxFrameBytes)}, rcfg.CallOptions...)
	if tlsOn {
		rcfg.ServerOptions = append(rcfg.ServerOptions, countingCreds(hooks.limits, server, &hooks.counts, log))
		rcfg.DialOptions = append(rcfg.DialOptions, grpc.WithTransportCredentials(client))
	}
}

// remoteWindowBytes is the HTTP/2 flow-control window of the remote's
// connections and streams, fixed. gRPC's default starts at 64 KiB and
// grows it by estimating the bandwidth-delay product, with a ping for
// every burst of data read: on a move's small control messages, most of a
// hop's frames were those pings, their acknowledgements and window
// updates, each a write on the socket (`make bench` section (g)). A fixed
// window turns the estimator off. 4 MiB covers a 10 Gb/s link at 3 ms
// round trip, and stays below the 16 MiB the estimator may grow a window
// to; large payloads travel on the chunk link, not here. An application's
// own window options (RemoteOptions) come later and win, if at least
// 64 KiB (gRPC ignores smaller ones).
const remoteWindowBytes = 4 << 20

// unimplemented are Proto.Actor remote RPCs whose server side panics
// ("implement me"): one call from anyone who can reach the port would end
// the process.
var unimplemented = []string{"/remote.Remoting/ListProcesses", "/remote.Remoting/GetProcessDiagnostics"}

// guardUnary refuses the unimplemented RPCs and turns a panicking handler
// into an Internal error for that call, logged, instead of the end of the
// process.
func guardUnary(log zerolog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		for _, m := range unimplemented {
			if info.FullMethod == m {
				return nil, status.Errorf(codes.Unimplemented, "%s is not served by roam nodes", m)
			}
		}
		defer func() {
			if r := recover(); r != nil {
				err = panicked(log, info.FullMethod, r)
			}
		}()
		return handler(ctx, req)
	}
}

// guardStream checks every frame a peer sends before Proto.Actor decodes
// it (CheckRemoteMessage) and ends the stream on the first bad one; with
// TLS it also requires the connection's certificate to name the host of
// the address the peer connects as, and the node the store has there
// before the peer may speak to a control actor or answer a question. A
// handler that panics anyway ends its stream with Internal, logged,
// instead of the process.
func guardStream(log zerolog.Logger, tlsOn bool, sys *actor.ActorSystem, hooks *remoteHooks) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = panicked(log, info.FullMethod, r)
			}
		}()
		g := &guardedStream{ServerStream: ss, log: log, self: sys.Address, hooks: hooks}
		defer hooks.watches.ended(g)
		if tlsOn {
			g.leaf = peerCertificate(ss.Context())
			if g.leaf == nil {
				return status.Error(codes.Unauthenticated, "no verified client certificate")
			}
		}
		return handler(srv, g)
	}
}

// peerCertificate is the verified leaf certificate of the stream's peer.
func peerCertificate(ctx context.Context) *x509.Certificate {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.PeerCertificates) == 0 {
		return nil
	}
	return info.State.PeerCertificates[0]
}

// frameRefusedLog limits remote_frame_refused lines: a peer can open
// streams and send bad frames at will.
var frameRefusedLog ratelog.Limiter

type guardedStream struct {
	grpc.ServerStream
	log   zerolog.Logger
	leaf  *x509.Certificate // the peer's certificate, with TLS
	self  func() string     // this node's address
	hooks *remoteHooks
	// declared is the address the peer connected as (its connect
	// request's), "" before it said; with TLS, one its certificate names.
	declared string
	// identified: with TLS, the certificate names the node the store has
	// at declared (checked once per stream, when it first matters).
	identified bool
	// unidentified: the frame being checked speaks for a node whose
	// identity could not be told yet (errNotYet); retryAt is when to ask
	// the store again.
	unidentified bool
	retryAt      time.Time
	started      bool // the first frame arrived
}

func (g *guardedStream) RecvMsg(m any) error {
	if !g.started {
		g.started = true
		if err := firstFrame(g.Context(), g.ServerStream, m, g.hooks.limits.FirstFrameTimeout); err != nil {
			if errors.Is(err, errNoFirstFrame) {
				g.hooks.counts.streams.Add(1)
				return status.Error(codes.DeadlineExceeded, "no first frame in time")
			}
			return err
		}
	} else if err := g.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	rm, ok := m.(*remote.RemoteMessage)
	if !ok {
		return nil
	}
	err := CheckRemoteMessage(rm)
	if err == nil && g.declared != "" && rm.GetConnectRequest() != nil {
		// A stream speaks for one address: a second connect request
		// would make it speak for another after it was checked.
		err = errors.New("a second connect request on one stream")
	}
	g.unidentified = false
	if err == nil && g.leaf != nil {
		if err = g.certified(rm); err != nil {
			// Answers to this node's questions in the frame are refused
			// with it, and counted as such.
			b := rm.GetMessageBatch()
			for _, e := range b.GetEnvelopes() {
				if id := b.Targets[e.Target].GetId(); ask.IsRoute(id) {
					_, what, _ := ask.Expected(id)
					ask.Refuse(what, "its connection does not speak for the node asked")
				}
			}
		}
	}
	if err == nil {
		if sc := rm.GetConnectRequest().GetServerConnection(); sc != nil {
			g.declared = sc.GetAddress()
		}
		g.dropRefused(rm.GetMessageBatch())
	}
	if err != nil {
		from := ""
		if p, ok := peer.FromContext(g.Context()); ok {
			from = p.Addr.String()
		}
		frameRefusedLog.Warn(&g.log).Str("event", "remote_frame_refused").Str("peer", from).Str("error", ratelog.Clip(err.Error())).
			Msg("a peer sent a frame the node does not accept; its stream is ended")
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return nil
}

// dropRefused takes out of a checked batch, each alone and logged, the
// messages a peer may not send, so that the rest of the stream goes on:
//   - actor.Stop and actor.PoisonPill to any actor: roam's actors refuse
//     them anyway, and Proto.Actor's own (its endpoint supervisor) would
//     stop, and the next send to a new peer panics the process;
//   - a message for another node's actor: Proto.Actor would pass it on
//     from this node, so a peer could speak through it to a third node
//     (whose certificate check would then end this node's stream there);
//   - an answer to a question this node asked (package ask) that no
//     question waits for, or that comes from a connection of another
//     node than the one asked: forged, replayed or misdirected.
func (g *guardedStream) dropRefused(b *remote.MessageBatch) {
	if b == nil {
		return
	}
	kept := b.Envelopes[:0]
	for _, e := range b.Envelopes {
		target, typeName := b.Targets[e.Target], b.TypeNames[e.TypeId]
		why := ""
		switch {
		case typeName == "actor.Stop" || typeName == "actor.PoisonPill":
			why = "a stop from a peer"
		case typeName == "actor.Watch" || typeName == "actor.Unwatch":
			why = g.watchRefused(target.GetId(), typeName == "actor.Watch", e.MessageData)
		case typeName == "actor.Terminated":
			why = g.terminatedRefused(e.MessageData)
		case target.GetAddress() != g.self():
			why = "a message for another node, to pass on"
		case g.unidentified && (isControlActor(target.GetId()) || ask.IsRoute(target.GetId())):
			why = "the peer's identity cannot be checked now"
			if ask.IsRoute(target.GetId()) {
				_, what, _ := ask.Expected(target.GetId())
				ask.Refuse(what, why)
			}
		case ask.IsRoute(target.GetId()):
			if why = g.answerRefused(target.GetId()); why != "" {
				continue // counted and logged by ask
			}
		}
		if why == "" {
			kept = append(kept, e)
			continue
		}
		g.hooks.counts.messages.Add(1)
		messageRefusedLog.Warn(&g.log).Str("event", "remote_message_refused").Str("reason", why).Str("target", ratelog.Clip(target.GetId())).
			Str("message_type", ratelog.Clip(typeName)).Msg("a peer's message was dropped; its stream goes on")
	}
	b.Envelopes = kept
}

// terminatedRefused says why a peer's Terminated may not go on, "" if it
// may: it tells that an actor of the peer's own process stopped, so the
// actor must be at the address the peer connected as. Proto.Actor connects
// to the stopped actor's address to deliver it, so a Terminated naming
// any other address would make the node dial wherever a peer says.
func (g *guardedStream) terminatedRefused(data []byte) string {
	var m actor.Terminated
	if proto.Unmarshal(data, &m) != nil || m.Who == nil {
		return "a malformed termination"
	}
	if g.declared == "" || m.Who.GetAddress() != g.declared {
		return "a termination of an actor not at the peer's address"
	}
	return ""
}

// watchRefused says why a peer's watch (or unwatch) of the actor id may
// not go on, "" if it may: roam's service actors and Sessions are never
// watched from outside (nothing of roam's needs it); the watcher must be
// an actor of the peer's own process (the node would tell another address
// when the actor stops, so dial where a peer says); and watches are
// bounded by the node's watch ledger.
func (g *guardedStream) watchRefused(id string, watch bool, data []byte) string {
	if isControlActor(id) || strings.HasPrefix(id, sessionPrefix) {
		if watch {
			g.hooks.counts.watches.Add(1)
		}
		return "a watch of one of roam's service actors"
	}
	var watcher *actor.PID
	if watch {
		var m actor.Watch
		if proto.Unmarshal(data, &m) != nil || m.Watcher == nil {
			return "a malformed watch"
		}
		watcher = m.Watcher
	} else {
		var m actor.Unwatch
		if proto.Unmarshal(data, &m) != nil || m.Watcher == nil {
			return "a malformed unwatch"
		}
		watcher = m.Watcher
	}
	if g.declared == "" || watcher.GetAddress() != g.declared {
		return "a watcher not at the peer's address"
	}
	if !watch {
		g.hooks.watches.release(id, watcher)
		return ""
	}
	if !g.hooks.watches.admit(g, g.watchBudget(), id, watcher) {
		return "past the node's watch limit"
	}
	return ""
}

// sessionPrefix starts the PID ids of Sessions (sessionhost.PIDName).
const sessionPrefix = "roam/session/"

// watchBudget names whose share of the watch limit a peer's watch takes:
// with TLS its certificate's (a peer cannot spend another's by claiming its
// address), else the address it connected as.
func (g *guardedStream) watchBudget() string {
	if g.leaf != nil {
		sum := sha256.Sum256(g.leaf.Raw)
		return "cert:" + hex.EncodeToString(sum[:12])
	}
	return g.declared
}

// answerRefused says why an answer to the question at reply route id may
// not come over this stream, "" if it may: a question waits there, and
// the stream is a connection of the node asked.
func (g *guardedStream) answerRefused(id string) string {
	from, what, waiting := ask.Expected(id)
	why := ""
	switch {
	case !waiting && ask.Late(id, g.declared):
		return "late" // counted by ask, not refused: nothing forged
	case !waiting:
		what, why = "unknown", "no question waits for it, from this node (forged or misdirected)"
	case from != "" && g.declared != from:
		why = "it came from another node than the one asked"
	}
	if why != "" {
		ask.Refuse(what, why)
	}
	return why
}

// messageRefusedLog limits remote_message_refused lines.
var messageRefusedLog ratelog.Limiter

// certified checks, with TLS, the addresses a frame speaks for: the one a
// connect request declares must be on a host the certificate names; a
// message to a control actor, with or without a sender, must be sent from
// that address (if it names a sender), and it, like an answer to a
// question, needs the certificate to name the node the store has there
// (identify).
func (g *guardedStream) certified(rm *remote.RemoteMessage) error {
	if sc := rm.GetConnectRequest().GetServerConnection(); sc != nil && !certifiedFor(g.leaf, sc.GetAddress()) {
		return fmt.Errorf("the peer's certificate does not name the host of %s, the address it connects as", sc.GetAddress())
	}
	b := rm.GetMessageBatch()
	for _, e := range b.GetEnvelopes() {
		target := b.Targets[e.Target].GetId()
		control := isControlActor(target)
		if !control && !ask.IsRoute(target) {
			continue
		}
		if control && e.Sender != 0 {
			if s := b.Senders[e.Sender-1]; s.GetAddress() != g.declared {
				return fmt.Errorf("a control message's sender %s is not the address the peer connects as", s.GetAddress())
			}
		}
		if err := g.identify(); errors.Is(err, errNotYet) {
			g.unidentified = true // its control messages and answers are dropped
		} else if err != nil {
			return err
		}
	}
	return nil
}

// errNotYet: the peer's identity cannot be told now (this node is not
// started, or the store cannot answer about an address it never read).
// Its control messages and answers are dropped, counted, while the stream
// goes on: ending it would cut the peer's other traffic over a store
// outage or a start.
var errNotYet = errors.New("the peer's identity cannot be checked now")

// identify checks, once per stream, that the peer's certificate names the
// node the Location Store has at the address the peer connects as. When
// the store cannot answer, the last descriptor read for that address
// decides: a store outage must not cut the members off each other.
func (g *guardedStream) identify() error {
	if g.identified {
		return nil
	}
	if g.declared == "" {
		return errors.New("the peer spoke for a node before it connected as one")
	}
	named := certNodes(g.leaf)
	if len(named) == 0 {
		return errors.New("the peer's certificate names no roam node")
	}
	n := g.hooks.node.Load()
	if n == nil || machine.Real.Now().Before(g.retryAt) { // pacing
		return errNotYet
	}
	ctx, cancel := machine.WithTimeout(g.Context(), machine.Real, identifyTimeout) // a handshake on a socket: real time
	defer cancel()
	d, err := n.PeerAt(ctx, g.declared)
	if err != nil && !errors.Is(err, ErrNotMember) {
		d = n.members.lastKnown(g.declared)
	}
	switch {
	case d == nil && errors.Is(err, ErrNotMember):
		return fmt.Errorf("the peer connects as %s, where no live node is: %w", g.declared, err)
	case d == nil && err != nil:
		// Not asked again for a moment: each try holds the stream.
		g.retryAt = machine.Real.Now().Add(time.Second)
		return errNotYet
	case !slices.Contains(named, d.GetName()):
		return fmt.Errorf("the peer's certificate names node(s) %q, the node at %s is %q", named, g.declared, d.GetName())
	}
	g.identified = true
	return nil
}

// identifyTimeout bounds the store read that identifies a peer: the
// stream waits for it.
const identifyTimeout = 2 * time.Second

func isControlActor(id string) bool {
	for _, n := range ControlActors {
		if id == n {
			return true
		}
	}
	return false
}

// CheckRemoteMessage checks a frame of Proto.Actor's remote protocol as
// its endpoint reader will use it, before it does: every index a message
// envelope holds (type name, target, sender, serializer) is in range, and
// a protobuf type name is linked into this program. Proto.Actor indexes
// without checking and dereferences an unknown type, so any one of these
// would panic the reader.
func CheckRemoteMessage(rm *remote.RemoteMessage) error {
	b := rm.GetMessageBatch()
	if b == nil {
		return nil
	}
	for i, t := range b.Targets {
		if t == nil {
			return fmt.Errorf("target %d is empty", i)
		}
	}
	for i, s := range b.Senders {
		if s == nil {
			return fmt.Errorf("sender %d is empty", i+1)
		}
	}
	linked := make([]int8, len(b.TypeNames)) // 0 unknown, 1 linked, -1 not: one lookup per type, not per message
	for i, e := range b.Envelopes {
		switch {
		case e == nil:
			return fmt.Errorf("envelope %d is empty", i)
		case e.Target < 0 || int(e.Target) >= len(b.Targets):
			return fmt.Errorf("envelope %d: target %d of %d", i, e.Target, len(b.Targets))
		case e.Sender < 0 || int(e.Sender) > len(b.Senders):
			return fmt.Errorf("envelope %d: sender %d of %d", i, e.Sender, len(b.Senders))
		case e.TypeId < 0 || int(e.TypeId) >= len(b.TypeNames):
			return fmt.Errorf("envelope %d: type %d of %d", i, e.TypeId, len(b.TypeNames))
		case e.SerializerId < 0 || int(e.SerializerId) >= serializerCount():
			return fmt.Errorf("envelope %d: serializer %d is not registered", i, e.SerializerId)
		case e.SerializerId == 0:
			if linked[e.TypeId] == 0 {
				linked[e.TypeId] = 1
				if _, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(b.TypeNames[e.TypeId])); err != nil {
					linked[e.TypeId] = -1
				}
			}
			if linked[e.TypeId] < 0 {
				return fmt.Errorf("envelope %d: message type %q is not linked into this node", i, ratelog.Clip(b.TypeNames[e.TypeId]))
			}
		}
	}
	return nil
}

// serializerCount is how many serializers Proto.Actor has registered
// (RegisterSerializer appends to a list it does not expose); counted once,
// after init, by probing each index.
var serializerCount = sync.OnceValue(func() int {
	n := 0
	for n < 64 && serializerRegistered(int32(n)) {
		n++
	}
	return n
})

func serializerRegistered(id int32) (ok bool) {
	defer func() {
		if r := recover(); r != nil {
			re, isRuntime := r.(runtime.Error)
			ok = !isRuntime || !strings.Contains(re.Error(), "index out of range")
		}
	}()
	_, _ = remote.Deserialize(nil, "", id)
	return true
}

func panicked(log zerolog.Logger, method string, r any) error {
	log.Error().Str("event", "remote_call_panicked").Str("method", method).Str("panic", strings.TrimSpace(fmt.Sprint(r))).
		Msg("a remote call's handler panicked; the call ended, the node goes on")
	return status.Errorf(codes.Internal, "%s failed", method)
}

// MaxMessageBytes is the largest message roam lets a node send to a peer:
// the frame limit less room for a frame's headers and tables. A Spot call
// with a larger message fails at once with CapacityExceeded; a move's
// payload is chunked well below it.
const MaxMessageBytes = MaxFrameBytes - 1<<20

// frameTarget is the size a node's outgoing frames are split to. Proto.Actor
// puts up to 1,000 queued messages into one frame, and gRPC ends the whole
// stream — every message queued to that peer — on a frame over the
// receiver's limit. Frames of at most 4 MiB (gRPC's default limit, which a
// plain Proto.Actor peer keeps) reach any peer; one message larger than
// that still goes alone, up to MaxFrameBytes.
const frameTarget = defaultFrameBytes

// defaultFrameBytes is gRPC's default receive limit.
const defaultFrameBytes = 4 << 20

// splitFrames is the client side of a node's streams: it splits a frame
// over frameTarget into frames of whole messages, in order, and drops a
// single message over the peer's limit (limitOf) instead of letting it end
// the stream — logged as message_too_large and answered with a
// DeliveryFailed of class capacity_exceeded: to the peer's future when it
// was a reply to its request, else to a local sender.
func splitFrames(log zerolog.Logger, sys *actor.ActorSystem, limitOf func(address string) int) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			closeFailed(cc, method)
			return cs, err
		}
		s := &splitStream{ClientStream: cs, log: log, sys: sys, peer: cc.Target(), limitOf: limitOf, cc: cc, method: method}
		s.connecting.Store(true)
		return s, nil
	}
}

// receiveMethod is the stream Proto.Actor's endpoint writer opens to a
// peer.
const receiveMethod = "/remote.Remoting/Receive"

// closeFailed closes the connection of a peer stream that failed before
// it was connected. Proto.Actor's endpoint writer dials anew on each of
// its retries without closing the connection it failed on, and gRPC
// keeps such a connection reconnecting for ever: every unreachable
// address a node is made to send to (a peer can name any) would leave
// four of them behind, with their goroutines (docs/SECURITY.md).
func closeFailed(cc *grpc.ClientConn, method string) {
	if method == receiveMethod {
		_ = cc.Close()
	}
}

type splitStream struct {
	grpc.ClientStream
	log     zerolog.Logger
	sys     *actor.ActorSystem
	peer    string
	limitOf func(string) int
	limit   int // the peer's limit, once asked
	cc      *grpc.ClientConn
	method  string
	// connecting: the peer has not answered the stream's connect request
	// yet; a failure now ends the connection too (closeFailed).
	connecting atomic.Bool
}

func (s *splitStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if s.connecting.Load() {
		if err != nil {
			closeFailed(s.cc, s.method)
		}
		s.connecting.Store(false)
	}
	return err
}

func (s *splitStream) SendMsg(m any) error {
	err := s.sendMsg(m)
	if err != nil && s.connecting.Load() {
		closeFailed(s.cc, s.method)
	}
	return err
}

func (s *splitStream) sendMsg(m any) error {
	rm, ok := m.(*remote.RemoteMessage)
	if !ok || rm.GetMessageBatch() == nil || proto.Size(rm) <= frameTarget {
		return s.ClientStream.SendMsg(m)
	}
	if s.limit == 0 {
		s.limit = s.limitOf(s.peer)
	}
	for _, part := range SplitBatch(rm.GetMessageBatch(), frameTarget, s.limit, s.tooLarge) {
		if err := s.ClientStream.SendMsg(&remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: part}}); err != nil {
			return err
		}
	}
	return nil
}

func (s *splitStream) tooLarge(b *remote.MessageBatch, e *remote.MessageEnvelope, size int) {
	t := b.Targets[e.Target]
	target := &actor.PID{Address: t.Address, Id: t.Id, RequestId: e.TargetRequestId}
	var sender *actor.PID
	if e.Sender > 0 {
		sn := b.Senders[e.Sender-1]
		sender = &actor.PID{Address: sn.Address, Id: sn.Id, RequestId: e.SenderRequestId}
	}
	typeName := b.TypeNames[e.TypeId]
	refuseTooLarge(s.log, s.sys, s.peer, target, sender, typeName, typeName == failure.GrainRequestType, size, s.limit)
}

// SplitBatch splits b into batches of whole messages, in order, each at
// most target bytes as a RemoteMessage frame — or, for a message that does not fit one on
// its own, a batch of that message alone with only the table entries it
// uses, up to limit bytes. A message over limit even so is passed to drop
// and left out.
func SplitBatch(b *remote.MessageBatch, target, limit int, drop func(*remote.MessageBatch, *remote.MessageEnvelope, int)) []*remote.MessageBatch {
	// Sizes are of the frame sent: the batch inside its RemoteMessage,
	// whose field tag and length add up to 6 bytes.
	const wrap = 6
	tables := wrap + proto.Size(&remote.MessageBatch{TypeNames: b.TypeNames, Targets: b.Targets, Senders: b.Senders})
	var out []*remote.MessageBatch
	var cur []*remote.MessageEnvelope
	size := tables
	flush := func() {
		if len(cur) > 0 {
			out = append(out, &remote.MessageBatch{TypeNames: b.TypeNames, Targets: b.Targets, Senders: b.Senders, Envelopes: cur})
			cur, size = nil, tables
		}
	}
	for _, e := range b.Envelopes {
		es := proto.Size(e) + 10 // the field's tag and length
		if tables+es <= target {
			if size+es > target {
				flush()
			}
			cur = append(cur, e)
			size += es
			continue
		}
		flush()
		alone := aloneBatch(b, e)
		if n := wrap + proto.Size(alone); n > limit {
			drop(b, e, n)
			continue
		}
		out = append(out, alone)
	}
	flush()
	return out
}

// aloneBatch is a batch of e alone, with only the table entries it uses.
func aloneBatch(b *remote.MessageBatch, e *remote.MessageEnvelope) *remote.MessageBatch {
	one := proto.Clone(e).(*remote.MessageEnvelope)
	a := &remote.MessageBatch{TypeNames: []string{b.TypeNames[e.TypeId]}, Targets: []*actor.PID{b.Targets[e.Target]}}
	one.TypeId, one.Target = 0, 0
	if e.Sender > 0 {
		a.Senders = []*actor.PID{b.Senders[e.Sender-1]}
		one.Sender = 1
	}
	a.Envelopes = []*remote.MessageEnvelope{one}
	return a
}
