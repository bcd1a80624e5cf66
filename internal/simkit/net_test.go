package simkit

import (
	"slices"
	"testing"
	"time"
)

type pkt struct {
	from, to int
	n        int
}

type netRec struct {
	s         *Sched
	net       *Net[pkt]
	delivered []pkt
	lost      []pkt
}

func newNetRec(places int) *netRec {
	r := &netRec{s: &Sched{}}
	r.net = NewNet(r.s, NewRand(3, 4), places, func(p pkt) { r.delivered = append(r.delivered, p) },
		func(p pkt) { r.lost = append(r.lost, p) })
	return r
}

func nums(ps []pkt) []int {
	var out []int
	for _, p := range ps {
		out = append(out, p.n)
	}
	return out
}

// A stream is FIFO whatever the delays: a later packet with a shorter
// delay waits for the earlier one. Two streams are independent: a packet
// on one passes a slower packet on the other.
func TestNetFIFOPerStream(t *testing.T) {
	r := newNetRec(3)
	a, b, c := End{0, 0}, End{1, 1}, End{2, 2}
	r.net.Send(a, b, 10*ms, pkt{0, 1, 1})
	r.net.Send(a, b, 1*ms, pkt{0, 1, 2})
	r.net.Send(a, b, 5*ms, pkt{0, 1, 3})
	r.net.Send(c, b, 2*ms, pkt{2, 1, 4})
	r.s.Run(time.Second, 0, nil)
	if got, want := nums(r.delivered), []int{4, 1, 2, 3}; !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v", got, want)
	}
}

// A cut loses what is in flight on the link (lost, not delivered) and
// tells the sending place after the detection delay; it refuses nothing
// itself, but Down reports the link cut until the cut's end. A one-way cut
// leaves the other direction alone; endpoints on one place are never cut
// apart; HealAll ends every cut, and what was lost stays lost.
func TestNetCut(t *testing.T) {
	r := newNetRec(3)
	a, b, a2 := End{0, 0}, End{1, 1}, End{5, 0}
	r.net.Send(a, b, 10*ms, pkt{0, 1, 1})
	r.net.Send(b, a, 10*ms, pkt{1, 0, 2})
	r.net.Send(a, a2, 10*ms, pkt{0, 0, 3})
	var told [][2]int
	var toldAt []time.Duration
	r.s.At(5*ms, func() {
		r.net.Cut(0, 1, false, 100*ms, func(from, to int) func() {
			return func() { told = append(told, [2]int{from, to}); toldAt = append(toldAt, r.s.Now()) }
		})
		if !r.net.Down(0, 1) || r.net.Down(1, 0) || r.net.Down(0, 0) {
			t.Errorf("after a one-way cut 0→1: down 0→1 %v, 1→0 %v, 0→0 %v", r.net.Down(0, 1), r.net.Down(1, 0), r.net.Down(0, 0))
		}
		// Sent after the cut: a new epoch, delivered (refusing it is the
		// simulation's, through Down), and still behind the lost packet's
		// time on its stream.
		r.net.Send(a, b, ms, pkt{0, 1, 4})
	})
	r.s.Run(50*ms, 0, nil)
	if got := nums(r.lost); !slices.Equal(got, []int{1}) {
		t.Fatalf("lost %v, want [1]", got)
	}
	if got := nums(r.delivered); !slices.Equal(got, []int{2, 3, 4}) {
		t.Fatalf("delivered %v, want [2 3 4]", got)
	}
	if len(told) != 1 || told[0] != [2]int{0, 1} || toldAt[0] < 6*ms || toldAt[0] > 35*ms {
		t.Fatalf("told %v at %v, want 0→1 once, 1–30 ms after the cut at 5ms", told, toldAt)
	}
	// Cut at 5 ms for 100 ms: down until 105 ms, and a shorter cut
	// meanwhile does not end it sooner.
	r.s.AdvanceTo(60 * ms)
	r.net.Cut(0, 1, false, ms, func(int, int) func() { return func() {} })
	r.s.AdvanceTo(104 * ms)
	if !r.net.Down(0, 1) {
		t.Fatal("the link is up before the cut's end")
	}
	r.s.AdvanceTo(105 * ms)
	if r.net.Down(0, 1) {
		t.Fatal("the link is down after the cut's end")
	}

	r.net.Cut(1, 2, true, time.Hour, func(int, int) func() { return func() {} })
	if !r.net.Down(1, 2) || !r.net.Down(2, 1) {
		t.Fatal("a two-way cut left a direction up")
	}
	r.net.HealAll()
	if r.net.Down(1, 2) || r.net.Down(2, 1) {
		t.Fatal("HealAll left a link down")
	}
}

// Delay draws 0.2–3 ms, and more only when a slow packet is drawn.
func TestNetDelay(t *testing.T) {
	r := newNetRec(1)
	slow := false
	for range 2000 {
		d := r.net.Delay(0, time.Second)
		if d < 200*time.Microsecond || d > 3*ms {
			t.Fatalf("delay %s outside 0.2–3 ms with no slow packets", d)
		}
		slow = slow || r.net.Delay(1, time.Second) > 3*ms
	}
	if !slow {
		t.Fatal("no slow packet in 2000 draws at probability 1")
	}
}
