package sim

import (
	"fmt"
	"time"

	"github.com/roamactors/roam/internal/relocation/envelope"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/session"
	"github.com/roamactors/roam/internal/simkit"
	"github.com/roamactors/roam/messages"
)

// pktKind names what a packet carries.
type pktKind int

const (
	pCapQuery pktKind = iota
	pCapReply
	pPrepare
	pChunk
	pCredit
	pRelayReady
	pFailed
	pAbort
	pRelay
	pCutover
	pBoundaryAck
	pFollow // an application message forwarded by Message Follow
	pClient // an application message from a client
	pAnswer // a failure answer to a client's request
	// Bound Sessions (gateway.go): commands 42 (and its reply), 43, 44.
	pSessionSeal
	pSessionSealReply
	pSessionRoute
	pSessionAbort
	// The source check before the seal (PROTOCOL.md §5.2) and its answer.
	pSourceCheck
	pSourceCheckReply
)

var pktNames = [...]string{"capability-query", "capability-reply", "prepare", "chunk", "credit", "relay-ready", "failed", "abort",
	"relay-record", "cutover", "boundary-ack", "follow", "client", "answer",
	"session-seal", "session-seal-reply", "session-route-update", "session-abort",
	"source-check", "source-check-reply"}

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
	check     bool   // capability reply: the target answers source checks
	code      string // a capability refusal's roamerr code
	capReq    uint64
	bytes     uint64 // credit: the payload bytes the target received
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
	members  []prepMember         // a SpotWide Spot's members, in participant order
	join     *messages.Membership // the User Spot a Join moves the Actor into, or nil
}

// prepMember is one SpotWide member as a Restore request names it.
type prepMember struct {
	obj                ObjID
	ownerGen, newOwner uint64
}

// Net carries packets between nodes and clients (endpoints: node
// indexes, then clients) on the harness's net: each direction of each pair
// is an ordered stream with its own random delays (so streams reorder
// against each other), and node links can be cut in one or both
// directions; a cut loses what is in flight and tells the sending side
// (remote.EndpointTerminatedEvent → ConnectionLost).
type Net struct {
	w *World
	k *simkit.Net[*packet]
	n int
	// notifying: a send on the cut link from→to (index from*n+to) will be
	// reported as a failed reconnect.
	notifying []bool
}

func newNet(w *World) *Net {
	n := w.cfg.Nodes + w.cfg.Clients
	nt := &Net{w: w, n: n, notifying: make([]bool, n*n)}
	nt.k = simkit.NewNet(&w.Sched, w.Rand, n, nt.deliver, nt.lost)
	return nt
}

func (w *World) endpointName(e int) string {
	if e < w.cfg.Nodes {
		return w.nodes[e].name
	}
	return fmt.Sprintf("c%d", e-w.cfg.Nodes+1)
}

func (nt *Net) send(p *packet) {
	w := nt.w
	if w.hooks.Packet != nil && w.hooks.Packet(w, p) {
		w.tracef("net %s→%s %s dropped (scenario)", w.endpointName(p.from), w.endpointName(p.to), p.kind)
		nt.dropped(p, "dropped by the scenario")
		return
	}
	if nt.k.Down(p.from, p.to) {
		if w.Tracing() {
			w.tracef("net %s→%s %s dropped (link down)", w.endpointName(p.from), w.endpointName(p.to), p.kind)
		}
		nt.dropped(p, "sent on a cut link")
		if i := p.from*nt.n + p.to; p.from < w.cfg.Nodes && p.to < w.cfg.Nodes && !nt.notifying[i] {
			// The send opens a new endpoint whose connection fails: the
			// sender learns it again (remote.EndpointTerminatedEvent).
			nt.notifying[i] = true
			from, to, life := w.nodes[p.from], p.to, w.nodes[p.from].life
			w.after(w.randDur(5*time.Millisecond, 50*time.Millisecond), "endpoint-terminated", func() {
				nt.notifying[i] = false
				if from.alive && from.life == life {
					from.endpointTerminated(to)
				}
			})
		}
		return
	}
	pSlow := w.faults.PSlowPacket
	if w.over {
		pSlow = 0
	}
	d := nt.k.Delay(pSlow, w.faults.SlowPacket)
	nt.k.Send(simkit.End{ID: p.from, Place: p.from}, simkit.End{ID: p.to, Place: p.to}, d, p)
}

// lost: p was in flight on a link that was cut.
func (nt *Net) lost(p *packet) {
	w := nt.w
	if w.Tracing() {
		w.tracef("net %s→%s %s lost in the cut", w.endpointName(p.from), w.endpointName(p.to), p.kind)
	}
	nt.dropped(p, "in flight on a cut link")
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
	nt.k.Cut(a, b, both, d, func(from, to int) func() {
		n := w.nodes[from]
		life := n.life
		return func() {
			if n.alive && n.life == life {
				n.endpointTerminated(to)
			}
		}
	})
}

func (nt *Net) healAll() { nt.k.HealAll() }
