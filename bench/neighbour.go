package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// streamChunk and streamWindow are the plain Proto.Actor stream that a
// move's state transfer is measured against: the same bytes in 256 KiB
// messages with at most 1 MiB unacknowledged.
const (
	streamChunk  = 256 << 10
	streamWindow = 1 << 20
)

// streamProbe streams bytes from a plain actor on node 0 to one on node 1,
// which acknowledges each message.
type streamProbe struct {
	root  *actor.RootContext
	sink  *actor.PID // on node 1, as node 0 reaches it
	acker *actor.PID // on node 0, as node 1 reaches it
	acks  chan struct{}
	chunk []byte
}

// streamSink acknowledges every chunk to the sender's acker.
type streamSink struct{}

func (streamSink) Receive(c actor.Context) {
	if _, ok := c.Message().(*wrapperspb.BytesValue); ok && c.Sender() != nil {
		c.Send(c.Sender(), wrapperspb.Bool(true))
	}
}

// streamAcker hands each acknowledgement to the streaming goroutine.
type streamAcker struct{ acks chan struct{} }

func (a *streamAcker) Receive(c actor.Context) {
	if _, ok := c.Message().(*wrapperspb.BoolValue); ok {
		a.acks <- struct{}{}
	}
}

func newStreamProbe(w *world) (*streamProbe, error) {
	acks := make(chan struct{}, streamWindow/streamChunk+1)
	a, err := w.nodes[0].System().Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return &streamAcker{acks: acks} }), "stream-acker")
	if err != nil {
		return nil, err
	}
	s, err := w.nodes[1].System().Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return streamSink{} }), "stream-sink")
	if err != nil {
		return nil, err
	}
	return &streamProbe{
		root:  w.nodes[0].System().Root,
		sink:  actor.NewPID(w.nodes[1].Node().Address(), s.Id),
		acker: actor.NewPID(w.nodes[0].Node().Address(), a.Id),
		acks:  acks,
		chunk: make([]byte, streamChunk),
	}, nil
}

// stream times size bytes from node 0 to node 1, first send to last
// acknowledgement.
func (p *streamProbe) stream(ctx context.Context, size int) (time.Duration, error) {
	n := (size + streamChunk - 1) / streamChunk
	window := streamWindow / streamChunk
	send := func(i int) {
		b := p.chunk
		if last := size - i*streamChunk; last < streamChunk {
			b = b[:last]
		}
		p.root.RequestWithCustomSender(p.sink, wrapperspb.Bytes(b), p.acker)
	}
	t := time.Now()
	sent := 0
	for ; sent < min(n, window); sent++ {
		send(sent)
	}
	for acked := 0; acked < n; acked++ {
		select {
		case <-p.acks:
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(time.Minute):
			return 0, fmt.Errorf("stream probe: no acknowledgement for a minute (%d of %d)", acked, n)
		}
		if sent < n {
			send(sent)
			sent++
		}
	}
	return time.Since(t), nil
}

// neighbour is a plain Proto.Actor actor on node 1 that other actors'
// requests (from node 0) reach while a Spot moves: their latency with a
// move in flight against without one.
type neighbour struct {
	root *actor.RootContext
	echo *actor.PID
	// phase: what runs beside the requests — nothing, a move, or a probe
	// of the baselines (whose requests count as neither).
	phase     atomic.Int32
	mu        sync.Mutex
	during    []time.Duration // requests that overlapped a move
	idle      []time.Duration // requests with nothing else in flight
	streaming []time.Duration // requests that overlapped the plain stream of the same bytes
	failed    int
	stop      chan struct{}
	done      sync.WaitGroup
}

const (
	phaseIdle int32 = iota
	phaseMoving
	phaseProbing
	phaseStreaming
)

type echo struct{}

func (echo) Receive(c actor.Context) {
	if m, ok := c.Message().(*wrapperspb.UInt64Value); ok {
		c.Respond(m)
	}
}

// startNeighbour starts requests from node 0 to an echo actor on node 1,
// one every millisecond, until stopped.
func startNeighbour(w *world) (*neighbour, error) {
	e, err := w.nodes[1].System().Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return echo{} }), "neighbour-echo")
	if err != nil {
		return nil, err
	}
	n := &neighbour{root: w.nodes[0].System().Root, echo: actor.NewPID(w.nodes[1].Node().Address(), e.Id), stop: make(chan struct{})}
	n.done.Add(1)
	go func() {
		defer n.done.Done()
		for i := uint64(0); ; i++ {
			select {
			case <-n.stop:
				return
			case <-time.After(time.Millisecond):
			}
			before := n.phase.Load()
			t := time.Now()
			_, err := n.root.RequestFuture(n.echo, wrapperspb.UInt64(i), 10*time.Second).Result()
			d := time.Since(t)
			after := n.phase.Load()
			n.mu.Lock()
			switch {
			case err != nil:
				n.failed++
			case before == phaseMoving || after == phaseMoving:
				n.during = append(n.during, d)
			case before == phaseStreaming || after == phaseStreaming:
				n.streaming = append(n.streaming, d)
			case before == phaseIdle && after == phaseIdle:
				n.idle = append(n.idle, d)
			}
			n.mu.Unlock()
		}
	}()
	return n, nil
}

// end stops the requests and returns the p99 of those that overlapped a
// move, of those with nothing else in flight, and of those that
// overlapped the plain stream (ms); an error if any failed.
func (n *neighbour) end() (during, idle, streaming float64, err error) {
	close(n.stop)
	n.done.Wait()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.failed > 0 {
		return 0, 0, 0, fmt.Errorf("neighbour: %d requests failed", n.failed)
	}
	return ms(percentile(n.during, 0.99)), ms(percentile(n.idle, 0.99)), ms(percentile(n.streaming, 0.99)), nil
}
