package spotsim

import (
	"fmt"
	"time"

	"github.com/roamactors/roam/internal/simkit"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// pktKind names what a packet carries.
type pktKind int

const (
	pCmd39   pktKind = iota // a SpotActivation (route kind 2) to a node's Spot service
	pApp                    // an application message to an incarnation's PID
	pReply                  // a request's reply, to its caller
	pFailure                // a DeliveryFailed, to a request's caller
)

var pktNames = [...]string{"command-39", "app", "reply", "failure"}

// packet is one message between two lifecycles' remotes.
type packet struct {
	from, to *Life
	kind     pktKind
	msg      *Msg
	env      *messages.SpotActivation // pCmd39
	pid      pidKey                   // pApp
	fail     failure                  // pFailure
}

// failure is a typed failure as a caller sees it: its class (roamerr
// code) and whether the system claims the message did not run (definite)
// or cannot tell (a timeout, a lost connection, a write whose outcome is
// unknown: docs/PROTOCOL.md §7.4).
type failure struct {
	code     string
	definite bool
	why      string
}

// Net carries packets between lifecycles on the harness's net: each
// direction of each pair of lifecycles is a FIFO stream with random delays
// (streams reorder against each other); the link between two nodes can be
// cut in one or both directions (what is in flight is lost, sends
// meanwhile are dropped, the sending side learns it:
// remote.EndpointTerminatedEvent); packets can be slow. Lifecycles on one
// node talk without a link and without delay.
type Net struct {
	w *World
	k *simkit.Net[*packet]
}

func newNet(w *World) *Net {
	nt := &Net{w: w}
	nt.k = simkit.NewNet(&w.Sched, w.Rand, w.cfg.Nodes, nt.deliver, nt.lost)
	return nt
}

// detectDelay is how long a remote takes to learn that a peer's process
// is gone.
const detectDelay = 10 * time.Millisecond

func (nt *Net) send(p *packet) {
	w := nt.w
	from, to := p.from, p.to
	if to.gone && w.Now() >= to.goneAt+detectDelay {
		// The peer's endpoint is known terminated: Proto.Actor hands the
		// message to the sender's dead letters.
		nt.deadLetterAtSender(p, "its node is gone")
		return
	}
	var d time.Duration
	if from.node != to.node {
		if nt.k.Down(from.node.idx, to.node.idx) {
			if w.Tracing() {
				w.tracef("net %s→%s %s dropped (link down)", from, to, p.kind)
			}
			nt.dropped(p, "sent on a cut link")
			return
		}
		pSlow := w.faults.PSlowPacket
		if w.over {
			pSlow = 0
		}
		d = nt.k.Delay(pSlow, w.faults.SlowPacket)
		if p.kind == pCmd39 && !w.over && w.chance(w.faults.PDropCmd39) {
			// The connection resets with the envelope in flight.
			nt.cut(from.node.idx, to.node.idx, w.Rand.IntN(2) == 0, w.randDur(time.Millisecond, w.faults.CutFor))
		}
	}
	nt.k.Send(simkit.End{ID: from.addr, Place: from.node.idx}, simkit.End{ID: to.addr, Place: to.node.idx}, d, p)
}

func (nt *Net) deliver(p *packet) {
	if p.to.gone {
		nt.dropped(p, "sent to a node that is down")
		return
	}
	p.to.receive(p)
}

// lost: p was in flight on a link that was cut.
func (nt *Net) lost(p *packet) {
	if w := nt.w; w.Tracing() {
		w.tracef("net %s→%s %s lost in the cut", p.from, p.to, p.kind)
	}
	nt.dropped(p, "in flight on a cut link")
}

func (k pktKind) String() string { return pktNames[k] }

// dropped accounts for an application message lost with its packet.
func (nt *Net) dropped(p *packet, why string) {
	if p.msg == nil || (p.kind != pCmd39 && p.kind != pApp) {
		return
	}
	nt.w.lostMsg(p.msg, lossTransit, why)
}

// deadLetterAtSender: a packet to a gone peer becomes a dead letter on
// the sending node. A send to an incarnation is redelivered from the
// store by that node's driver; a request's caller gets a dead-letter
// answer (ErrStale); a SpotActivation fails loudly (Driver.onActivationDeadLetter:
// a request is answered Unavailable, a send logged and counted).
func (nt *Net) deadLetterAtSender(p *packet, why string) {
	w := nt.w
	m := p.msg
	switch p.kind {
	case pApp:
		if m.request {
			if w.Tracing() {
				w.tracef("%s dead letter: m%d for %s (%s)", p.from, m.id, p.pid, why)
			}
			w.answerFailure(p.from, m, failure{code: roamerr.CodeStale, definite: true, why: "dead letter: " + why})
			return
		}
		p.from.deadLettered(m, p.pid)
	case pCmd39:
		if w.Tracing() {
			w.tracef("%s dead letter: command 39 %s for %s (%s): Proto.Actor only logs it", p.from, p.env.GetOperationId(), m.spot.id, why)
		}
		m.cmd39DeadLetter = true
		w.answerFailure(p.from, m, failure{code: roamerr.CodeUnavailable, definite: true, why: "command 39 dead-lettered: " + why})
	}
}

// cut cuts the link a→b (and b→a if both) for d: what is in flight is
// lost, sends meanwhile are dropped, and each sending node learns it
// after a detection delay.
func (nt *Net) cut(a, b int, both bool, d time.Duration) {
	w := nt.w
	w.stats.Cuts++
	w.tracef("net: cut %s→%s%s for %s", w.nodes[a].name, w.nodes[b].name, map[bool]string{true: " and back", false: ""}[both], ms(d))
	nt.k.Cut(a, b, both, d, func(from, to int) func() {
		n, peer := w.nodes[from], w.nodes[to]
		return func() {
			for _, l := range n.lives {
				if !l.gone {
					l.endpointLost(peer)
				}
			}
		}
	})
}

func (nt *Net) healAll() { nt.k.HealAll() }

func (p pidKey) String() string {
	return fmt.Sprintf("%s@%s.%d", p.spot, genString(p.gen), p.ownerGen)
}
