package simkit

import "time"

// End is one end of a packet's way: the endpoint that sends or receives
// it (a process, a client) and the place it runs on (a node). Endpoints
// have one FIFO stream per ordered pair; places have one link per ordered
// pair, which a cut takes down. Two endpoints on one place talk without a
// link: nothing can cut them apart.
type End struct{ ID, Place int }

type link struct {
	epoch     uint64 // bumped by a cut: what was sent before is lost
	downUntil time.Duration
}

// Net carries packets of type P. Each ordered pair of endpoints is a FIFO
// stream with its own random delays, so streams reorder against each
// other but never within themselves. The link between two places can be
// cut, one way or both, for a while: what is in flight on it is lost and
// handed to lost, and the sender is told after a detection delay (as
// Proto.Actor's remote reports an EndpointTerminatedEvent). Sends while a
// link is down are the simulation's to refuse (Down), because what a
// refused send means differs by model.
type Net[P any] struct {
	s       *Sched
	r       *Rand
	places  int
	links   []link
	streams map[[2]int]time.Duration // the last delivery time per stream
	deliver func(P)
	lost    func(P)
}

// NewNet returns a net between places places on s's clock, drawing delays
// from r. deliver receives each packet that arrives; lost each that was in
// flight on a link when it was cut.
func NewNet[P any](s *Sched, r *Rand, places int, deliver, lost func(P)) *Net[P] {
	return &Net[P]{s: s, r: r, places: places, links: make([]link, places*places), streams: map[[2]int]time.Duration{},
		deliver: deliver, lost: lost}
}

func (n *Net[P]) link(a, b int) *link { return &n.links[a*n.places+b] }

// Delay draws a packet's latency: 0.2–3 ms and, with probability pSlow,
// up to slow more.
func (n *Net[P]) Delay(pSlow float64, slow time.Duration) time.Duration {
	d := n.r.Dur(200*time.Microsecond, 3*time.Millisecond)
	if n.r.Chance(pSlow) {
		d += n.r.Dur(0, slow)
	}
	return d
}

// Down reports whether the link from place a to place b is cut now.
func (n *Net[P]) Down(a, b int) bool { return a != b && n.s.Now() < n.link(a, b).downUntil }

// Send sends p from one end to the other, d from now but never before the
// stream's previous packet. Across places, a cut of the link before p
// arrives loses it.
func (n *Net[P]) Send(from, to End, d time.Duration, p P) {
	k := [2]int{from.ID, to.ID}
	at := max(n.s.Now()+d, n.streams[k])
	n.streams[k] = at
	if from.Place == to.Place {
		n.s.At(at, func() { n.deliver(p) })
		return
	}
	l := n.link(from.Place, to.Place)
	epoch := l.epoch
	n.s.At(at, func() {
		if l.epoch != epoch {
			n.lost(p)
			return
		}
		n.deliver(p)
	})
}

// Cut takes the link a→b (and b→a if both) down for d: what is in flight
// on it is lost, and Down reports it until d has passed (a later cut may
// extend it). For each direction cut, told(from, to) is asked at once what
// the sending place learns, and its answer runs after a detection delay of
// 1–30 ms (told sees the sender as it is at the cut; the answer, as it is
// when it learns).
func (n *Net[P]) Cut(a, b int, both bool, d time.Duration, told func(from, to int) func()) {
	dirs := [][2]int{{a, b}}
	if both {
		dirs = append(dirs, [2]int{b, a})
	}
	for _, dir := range dirs {
		l := n.link(dir[0], dir[1])
		l.epoch++
		l.downUntil = max(l.downUntil, n.s.Now()+d)
		n.s.After(n.r.Dur(time.Millisecond, 30*time.Millisecond), told(dir[0], dir[1]))
	}
}

// HealAll brings every link up (what a cut lost stays lost).
func (n *Net[P]) HealAll() {
	for i := range n.links {
		n.links[i].downUntil = 0
	}
}
