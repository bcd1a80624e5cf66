package sim

import (
	"fmt"
	"time"

	"github.com/roamactors/roam/internal/relocation/envelope"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/session"
	"github.com/roamactors/roam/messages"
)

// pktKind names what a packet carries.
type pktKind int

const (
	pCapQuery pktKind = iota
	pCapReply
	pPrepare
	pChunk
	pRelayReady
	pFailed
	pAbort
	pRelay
	pCutover
	pBoundaryAck
	pFollow // an application message forwarded by Message Follow
	pClient // an application message from a client
	pAnswer // a failure answer to a client's request
	// Bound Sessions (session.go): commands 42 (and its reply), 43, 44.
	pSessionSeal
	pSessionSealReply
	pSessionRoute
	pSessionAbort
)

var pktNames = [...]string{"capability-query", "capability-reply", "prepare", "chunk", "relay-ready", "failed", "abort",
	"relay-record", "cutover", "boundary-ack", "follow", "client", "answer",
	"session-seal", "session-seal-reply", "session-route-update", "session-abort"}

func (k pktKind) String() string { return pktNames[k] }

// packet is one message on a connection. Endpoints are node indexes, then
// clients (Nodes + client id).
type packet struct {
	from, to int
	kind     pktKind
	id       handoff.Identity

	prep      *prepare
	chunk     envelope.Chunk
	epoch     uint32
	index     int // relay: the record's place in the boundary batch
	sum       handoff.RelaySum
	msg       *Msg
	record    []byte
	reason    messages.FailureReason
	detail    string
	supported bool
	capReq    uint64
	inc       incKey // follow/client: the incarnation addressed
	// Session commands: the bound object, the route named, a refusal.
	obj   ObjID
	route session.Route
	serr  error
}

type prepare struct {
	obj      ObjID
	objGen   uint64
	manifest envelope.Manifest
	deadline time.Duration
	newOwner uint64
	source   int
}

// stream is one direction of a connection: FIFO, with an epoch that a cut
// bumps (packets of an older epoch still in flight are lost).
type stream struct {
	epoch     uint64
	last      time.Duration
	downUntil time.Duration
	notifying bool // a failed reconnect will be reported
}

// Net carries packets between nodes and clients: each direction of each
// pair is an ordered stream with its own random delays (so streams reorder
// against each other), and node links can be cut in one or both
// directions; a cut loses what is in flight and tells the sending side
// (remote.EndpointTerminatedEvent → ConnectionLost).
type Net struct {
	w       *World
	n       int
	streams []stream
}

func newNet(w *World) *Net {
	n := w.cfg.Nodes + w.cfg.Clients
	return &Net{w: w, n: n, streams: make([]stream, n*n)}
}

func (nt *Net) stream(from, to int) *stream { return &nt.streams[from*nt.n+to] }

func (w *World) endpointName(e int) string {
	if e < w.cfg.Nodes {
		return w.nodes[e].name
	}
	return fmt.Sprintf("c%d", e-w.cfg.Nodes+1)
}

func (nt *Net) send(p *packet) {
	w := nt.w
	s := nt.stream(p.from, p.to)
	if w.hooks.Packet != nil && w.hooks.Packet(w, p) {
		w.tracef("net %s→%s %s dropped (scenario)", w.endpointName(p.from), w.endpointName(p.to), p.kind)
		nt.dropped(p, "dropped by the scenario")
		return
	}
	if w.now < s.downUntil {
		if w.tracing {
			w.tracef("net %s→%s %s dropped (link down)", w.endpointName(p.from), w.endpointName(p.to), p.kind)
		}
		nt.dropped(p, "sent on a cut link")
		if p.from < w.cfg.Nodes && p.to < w.cfg.Nodes && !s.notifying {
			// The send opens a new endpoint whose connection fails: the
			// sender learns it again (remote.EndpointTerminatedEvent).
			s.notifying = true
			from, to, life := w.nodes[p.from], p.to, w.nodes[p.from].life
			w.after(w.randDur(5*time.Millisecond, 50*time.Millisecond), "endpoint-terminated", func() {
				s.notifying = false
				if from.alive && from.life == life {
					from.endpointTerminated(to)
				}
			})
		}
		return
	}
	d := w.randDur(200*time.Microsecond, 3*time.Millisecond)
	if !w.over && w.chance(w.faults.PSlowPacket) {
		d += w.randDur(0, w.faults.SlowPacket)
	}
	at := max(w.now+d, s.last)
	s.last = at
	epoch := s.epoch
	w.at(at, "deliver", func() {
		if s.epoch != epoch {
			if w.tracing {
				w.tracef("net %s→%s %s lost in the cut", w.endpointName(p.from), w.endpointName(p.to), p.kind)
			}
			nt.dropped(p, "in flight on a cut link")
			return
		}
		nt.deliver(p)
	})
}

func (nt *Net) deliver(p *packet) {
	w := nt.w
	if p.to >= w.cfg.Nodes {
		w.clients[p.to-w.cfg.Nodes].receive(p)
		return
	}
	n := w.nodes[p.to]
	if !n.alive {
		nt.dropped(p, "sent to a node that is down")
		return
	}
	n.receive(p)
}

// dropped accounts for an application message lost with its packet.
func (nt *Net) dropped(p *packet, why string) {
	if p.msg == nil {
		return
	}
	w := nt.w
	switch p.kind {
	case pClient:
		if !p.msg.accepted {
			w.unaccepted(p.msg, why)
			return
		}
		w.lostMsg(p.msg, lossTransit, why)
	case pFollow:
		if to := p.to; to < w.cfg.Nodes && !w.nodes[to].alive {
			w.lostMsg(p.msg, lossCrash, "followed to a node that is down")
			return
		}
		w.lostMsg(p.msg, lossFollow, "Message Follow: "+why)
	case pRelay:
		if to := p.to; to < w.cfg.Nodes && !w.nodes[to].alive {
			w.lostMsg(p.msg, lossCrash, "relayed to a node that is down")
			return
		}
		w.lostMsg(p.msg, lossTransit, "relay record "+why)
	}
}

// cut cuts the link a→b (and b→a if both) for d: what is in flight is
// lost, sends meanwhile are dropped, and the sending side (both, if both)
// learns it after a detection delay.
func (nt *Net) cut(a, b int, both bool, d time.Duration) {
	w := nt.w
	w.stats.Cuts++
	w.tracef("net: cut %s→%s%s for %s", w.endpointName(a), w.endpointName(b), map[bool]string{true: " and back", false: ""}[both], d)
	dirs := [][2]int{{a, b}}
	if both {
		dirs = append(dirs, [2]int{b, a})
	}
	for _, dir := range dirs {
		s := nt.stream(dir[0], dir[1])
		s.epoch++
		s.downUntil = max(s.downUntil, w.now+d)
		from, to := w.nodes[dir[0]], dir[1]
		life := from.life
		w.after(w.randDur(time.Millisecond, 30*time.Millisecond), "endpoint-terminated", func() {
			if from.alive && from.life == life {
				from.endpointTerminated(to)
			}
		})
	}
}

func (nt *Net) healAll() {
	for i := range nt.streams {
		nt.streams[i].downUntil = 0
	}
}
