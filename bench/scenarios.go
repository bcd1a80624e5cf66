package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/drain"
	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/location"
)

// pauseRow is scenario (a) for one state size on one store: the medians,
// over runs, of each run's pause p50 and p99, the largest pause seen, and
// the one-way sends lost (always counted; roam's claim is zero).
type pauseRow struct {
	Size          int
	P50, P99, Max float64 // ms
	Moves         int
	Sent, Lost    uint64
	// CAS is the median over runs of each run's p50 of one compare-and-set
	// on the store as cheaply as it allows (newCASProbe: on Consul a raw
	// transaction), probed between the moves (ms). Floor is Hops + CAS.
	CAS, Floor float64
	// Hops is the median over runs of each run's p50 of three one-way
	// messages between the two nodes' plain Proto.Actor actors (ms),
	// probed between the moves: the floor of a move's three one-way
	// hops (Restore request, relay-ready, cutover) on this machine.
	Hops float64
	// Stream is the median over runs of each run's p50 of the same bytes
	// as the state streamed between plain Proto.Actor actors on the two
	// nodes (256 KiB messages, at most 1 MiB unacknowledged), probed
	// between the moves (ms).
	Stream float64
	// NeighbourMoving and NeighbourIdle: the medians over runs of the p99
	// of other requests between the two nodes (plain actors, one a
	// millisecond), those that overlapped a move and those that did not
	// (ms).
	NeighbourMoving, NeighbourIdle float64
	// NeighbourStreaming: the same p99 for those that overlapped the plain
	// stream of the state's bytes.
	NeighbourStreaming float64
}

// pauseRuns gathers the pauses of several runs: a figure is the median of
// the runs' percentiles, the max is the largest of all.
type pauseRuns struct {
	p50s, p99s []float64
	max        float64
	moves      int
}

func (p *pauseRuns) add(pauses []time.Duration) {
	p.moves += len(pauses)
	p.p50s = append(p.p50s, ms(percentile(pauses, 0.5)))
	p.p99s = append(p.p99s, ms(percentile(pauses, 0.99)))
	p.max = max(p.max, ms(percentile(pauses, 1)))
}

// figures are the moves, and the p50, p99 and max pause in ms.
func (p *pauseRuns) figures() (moves int, p50, p99, maxMs float64) {
	return p.moves, median(p.p50s), median(p.p99s), p.max
}

// pauseVsSize moves one Spot with size bytes of state back and forth
// between two nodes while a sender posts numbered one-way messages to it
// by Spot ID; the pause is seal on the source → dispatch open on the
// target (relocation Event.Pause).
func pauseVsSize(ctx context.Context, newStore func() (location.Store, error), size, runs, moves int) (pauseRow, error) {
	row := pauseRow{Size: size}
	var pr pauseRuns
	var hopRuns, casRuns, streamRuns, nMoving, nIdle, nStreaming []float64
	for r := 0; r < runs; r++ {
		w, done, err := openWorld(ctx, newStore, 2)
		if err != nil {
			return row, err
		}
		id := fmt.Sprintf("blob-%d-%d", size, r)
		if err := w.activate(ctx, id, size); err != nil {
			done()
			return row, err
		}
		// The baselines: three hops, the same bytes streamed, and other
		// requests between the nodes throughout.
		probe, err := newHopProbe(w)
		var cas casProbe
		if err == nil {
			if cas, err = newCASProbe(ctx, w.store, location.Key(location.KindInstanceSpot, id)); err == nil {
				closeWorld := done
				done = func() { cas.close(); closeWorld() }
			}
		}
		var streamer *streamProbe
		if err == nil {
			streamer, err = newStreamProbe(w)
		}
		var near *neighbour
		if err == nil {
			near, err = startNeighbour(w)
		}
		if err != nil {
			done()
			return row, err
		}
		var hops, cass, streams []time.Duration
		var sent atomic.Uint64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(200 * time.Microsecond):
				}
				if _, err := w.nodes[0].Spots().Send(id, wrapperspb.UInt64(sent.Load()+1)).Do(ctx); err == nil {
					sent.Add(1)
				}
			}
		}()
		// fail stops the sender and the other requests and ends the run.
		fail := func(err error) (pauseRow, error) {
			close(stop)
			wg.Wait()
			_, _, _, _ = near.end()
			done()
			return row, err
		}
		for m := 0; m < moves; m++ {
			near.phase.Store(phaseMoving)
			_, err := w.move(ctx, id)
			near.phase.Store(phaseIdle)
			if err != nil {
				return fail(fmt.Errorf("move %d of %s: %w", m, id, err))
			}
			time.Sleep(10 * time.Millisecond)
			near.phase.Store(phaseProbing)
			h, err := probe.threeHops(ctx)
			var c, st time.Duration
			if err == nil {
				c, err = cas.once(ctx)
			}
			if err == nil {
				near.phase.Store(phaseStreaming)
				st, err = streamer.stream(ctx, size)
			}
			near.phase.Store(phaseIdle)
			if err != nil {
				return fail(err)
			}
			hops, cass, streams = append(hops, h), append(cass, c), append(streams, st)
			time.Sleep(10 * time.Millisecond)
		}
		close(stop)
		wg.Wait()
		moving, idle, streaming, err := near.end()
		if err != nil {
			done()
			return row, err
		}
		nMoving, nIdle, nStreaming = append(nMoving, moving), append(nIdle, idle), append(nStreaming, streaming)
		streamRuns = append(streamRuns, ms(percentile(streams, 0.5)))
		handled, err := count(ctx, w.nodes[0], id)
		if err != nil {
			done()
			return row, err
		}
		pr.add(w.takePauses())
		hopRuns = append(hopRuns, ms(percentile(hops, 0.5)))
		casRuns = append(casRuns, ms(percentile(cass, 0.5)))
		row.Sent += sent.Load()
		row.Lost += sent.Load() - min(handled, sent.Load())
		done()
	}
	row.Moves, row.P50, row.P99, row.Max = pr.figures()
	row.Hops = median(hopRuns)
	row.CAS = median(casRuns)
	row.Floor = row.Hops + row.CAS
	row.Stream = median(streamRuns)
	row.NeighbourMoving, row.NeighbourIdle, row.NeighbourStreaming = median(nMoving), median(nIdle), median(nStreaming)
	return row, nil
}

// hopProbe is a plain Proto.Actor actor on each of a world's first two
// nodes; a probe message bounces between them.
type hopProbe struct {
	start *actor.PID
	root  *actor.RootContext
	done  chan struct{}
}

// hopper forwards a count to its peer, one less each time; at zero it
// signals done.
type hopper struct {
	peer *actor.PID
	done chan struct{}
}

func (h *hopper) Receive(c actor.Context) {
	if m, ok := c.Message().(*wrapperspb.UInt64Value); ok {
		if m.Value == 0 {
			h.done <- struct{}{}
			return
		}
		c.Send(h.peer, wrapperspb.UInt64(m.Value-1))
	}
}

func newHopProbe(w *world) (*hopProbe, error) {
	done := make(chan struct{}, 1)
	h0, h1 := &hopper{done: done}, &hopper{done: done}
	p0, err := w.nodes[0].System().Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return h0 }), "hop-probe")
	if err != nil {
		return nil, err
	}
	p1, err := w.nodes[1].System().Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return h1 }), "hop-probe")
	if err != nil {
		return nil, err
	}
	h0.peer = actor.NewPID(w.nodes[1].Node().Address(), p1.Id)
	h1.peer = actor.NewPID(w.nodes[0].Node().Address(), p0.Id)
	return &hopProbe{start: p1, root: w.nodes[1].System().Root, done: done}, nil
}

// threeHops times node 1 → node 0 → node 1 → node 0, started on node 1
// (a local send first, as a move's Restore request is sent by the source
// driver to its peer).
func (p *hopProbe) threeHops(ctx context.Context) (time.Duration, error) {
	t := time.Now()
	p.root.Send(p.start, wrapperspb.UInt64(3))
	select {
	case <-p.done:
		return time.Since(t), nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// count asks the blob how many numbered sends it handled; the request
// queues behind them.
func count(ctx context.Context, via *extension.Extension, id string) (uint64, error) {
	reply, err := via.Spots().Request(id, wrapperspb.String("count")).Timeout(30 * time.Second).Do(ctx)
	if err != nil {
		return 0, err
	}
	return reply.(*wrapperspb.UInt64Value).Value, nil
}

// throughputRow is scenario (b): requests per second to one Spot.
type throughputRow struct {
	Static, Moving float64 // medians over runs, requests/s
	Ratio          float64 // median over runs of each run's moving / static
	Moves          int
}

// throughput runs closed-loop requesters against one Spot by Spot ID and
// alternates, in the same world, phases of d/2 with the Spot left alone
// and phases with it relocated every 100 ms (three of each, left alone
// first): the two are compared within one run, since two worlds started
// one after another differ by more than the moves cost.
func throughput(ctx context.Context, newStore func() (location.Store, error), runs int, d time.Duration) (throughputRow, error) {
	var row throughputRow
	var static, moving, ratios []float64
	for r := 0; r < runs; r++ {
		w, done, err := openWorld(ctx, newStore, 2)
		if err != nil {
			return row, err
		}
		id := fmt.Sprintf("hot-%d", r)
		if err := w.activate(ctx, id, 1<<10); err != nil {
			done()
			return row, err
		}
		completed, stopRequesters := requesters(ctx, w, id)
		var rate [2]struct {
			n       uint64
			elapsed time.Duration
		}
		for phase := 0; phase < 6; phase++ {
			relocate := phase%2 == 1
			start, before := time.Now(), completed.Load()
			for time.Since(start) < d/2 {
				if relocate {
					if _, err := w.move(ctx, id); err != nil {
						_ = stopRequesters()
						done()
						return row, err
					}
					row.Moves++
				}
				time.Sleep(100 * time.Millisecond)
			}
			i := 0
			if relocate {
				i = 1
			}
			rate[i].n += completed.Load() - before
			rate[i].elapsed += time.Since(start)
		}
		err = stopRequesters()
		done()
		if err != nil {
			return row, err
		}
		st, mv := float64(rate[0].n)/rate[0].elapsed.Seconds(), float64(rate[1].n)/rate[1].elapsed.Seconds()
		static, moving, ratios = append(static, st), append(moving, mv), append(ratios, mv/st)
	}
	row.Static, row.Moving, row.Ratio = median(static), median(moving), median(ratios)
	return row, nil
}

// bulkRow is scenario (c): moves per second of many Spots.
type bulkRow struct {
	Spots                  int
	Sequential, Concurrent float64 // moves/s
	CAS                    float64 // the store's own CAS rate, as many at a time (casRate)
}

// bulkMoves activates n Spots on node 0, moves them all to node 1 one
// after another, then back 32 at a time.
func bulkMoves(ctx context.Context, newStore func() (location.Store, error), n, parallel int) (bulkRow, error) {
	row := bulkRow{Spots: n}
	w, done, err := openWorld(ctx, newStore, 2)
	if err != nil {
		return row, err
	}
	defer done()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("many-%d", i)
	}
	// Activate on node 0 only: it is the only node while they activate.
	if err := each(ids, parallel, func(id string) error {
		_, err := w.nodes[0].SpawnInstanceSpot(ctx, "blob", id)
		return err
	}); err != nil {
		return row, err
	}
	start := time.Now()
	for _, id := range ids {
		if _, err := w.nodes[0].Relocate(ctx, extension.InstanceSpotRef(id), w.nodes[1].NodeRid()); err != nil {
			return row, err
		}
	}
	row.Sequential = float64(n) / time.Since(start).Seconds()
	start = time.Now()
	if err := each(ids, parallel, func(id string) error {
		_, err := w.nodes[1].Relocate(ctx, extension.InstanceSpotRef(id), w.nodes[0].NodeRid())
		return err
	}); err != nil {
		return row, err
	}
	row.Concurrent = float64(n) / time.Since(start).Seconds()
	_ = w.takePauses()
	row.CAS, err = casRate(ctx, w.store, ids[:parallel], n)
	return row, err
}

// casRate is the store's own compare-and-set rate with one writer per
// key of keys, all at once, n writes in all: each a CAS probe of (a)'s
// floor on a copy of that Spot's record (on Consul a raw txn sent with
// Consul's own client to the same agent).
func casRate(ctx context.Context, store location.Store, ids []string, n int) (float64, error) {
	probes := make([]casProbe, len(ids))
	for i, id := range ids {
		p, err := newCASProbe(ctx, store, location.AuthorityKey{Kind: location.KindInstanceSpot, ID: id})
		if err != nil {
			for _, q := range probes[:i] {
				q.close()
			}
			return 0, err
		}
		probes[i] = p
	}
	defer func() {
		for _, p := range probes {
			p.close()
		}
	}()
	var next atomic.Int64
	start := time.Now()
	err := forEach(len(probes), len(probes), func(i int) error {
		for next.Add(1) <= int64(n) {
			if _, err := probes[i].once(ctx); err != nil {
				return fmt.Errorf("CAS probe: %w", err)
			}
		}
		return nil
	})
	return float64(n) / time.Since(start).Seconds(), err
}

// each runs fn over ids with at most parallel at a time; the first
// error, named by its id, stops it.
func each(ids []string, parallel int, fn func(string) error) error {
	return forEach(len(ids), parallel, func(i int) error {
		if err := fn(ids[i]); err != nil {
			return fmt.Errorf("%s: %w", ids[i], err)
		}
		return nil
	})
}

// forEach runs fn(0..n-1) on workers goroutines; the first error stops it.
func forEach(n, workers int, fn func(i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				mu.Lock()
				failed := first != nil
				mu.Unlock()
				if failed {
					return
				}
				if err := fn(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// overheadRow is scenario (d2): plain Proto.Actor messaging against the
// same actor on roam's relocatable mailbox, one node to another; and a
// request to it by Spot ID against one by its PID.
type overheadRow struct {
	PlainRTT, RoamRTT   float64 // request round trip p50, µs
	PlainRate, RoamRate float64 // one-way messages/s
	// Requests to the roam Spot, by Spot ID (route cached) and by PID,
	// interleaved: round trip p50 and p99 (µs) one at a time, and
	// requests/s by requestCallers closed-loop callers.
	IDP50, IDP99, PIDP50, PIDP99 float64
	IDRate, PIDRate              float64
	IDCPU, PIDCPU                float64 // process CPU time per request in those rounds, µs
}

// requestCallers is how many callers (d2)'s request throughput runs, in
// requestRounds rounds of each way.
const (
	requestCallers = 32
	requestRounds  = 5
)

// overhead measures request round trips and one-way throughput to a plain
// actor (Proto.Actor's default mailbox) and to a roam Actor on node 1,
// from node 0, in the same run; and requests by Spot ID against requests
// by PID to the roam Actor.
func overhead(ctx context.Context, newStore func() (location.Store, error), requests, sends int) (overheadRow, error) {
	var row overheadRow
	w, done, err := openWorld(ctx, newStore, 2)
	if err != nil {
		return row, err
	}
	defer done()
	plain, err := w.nodes[1].System().Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return &blob{} }), "plain-blob")
	if err != nil {
		return row, err
	}
	roamPID, err := w.nodes[1].SpawnInstanceSpot(ctx, "blob", "roam-blob")
	if err != nil {
		return row, err
	}
	remotePlain := actor.NewPID(w.nodes[1].Node().Address(), plain.Id)
	remoteRoam := actor.NewPID(w.nodes[1].Node().Address(), roamPID.Id)
	root := w.nodes[0].System().Root
	byPID := func(pid *actor.PID) func() error {
		return func() error {
			_, err := root.RequestFuture(pid, wrapperspb.String("count"), 10*time.Second).Result()
			return err
		}
	}
	byID := func() error {
		_, err := w.nodes[0].Spots().Request("roam-blob", wrapperspb.String("count")).Do(ctx)
		return err
	}
	timed := func(call func() error, lat *[]time.Duration) error {
		t := time.Now()
		if err := call(); err != nil {
			return err
		}
		*lat = append(*lat, time.Since(t))
		return nil
	}
	µs := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }
	var plainLat, roamLat []time.Duration
	for i := 0; i < requests; i++ {
		if err := timed(byPID(remotePlain), &plainLat); err != nil {
			return row, err
		}
	}
	for i := 0; i < requests; i++ {
		if err := timed(byPID(remoteRoam), &roamLat); err != nil {
			return row, err
		}
	}
	row.PlainRTT, row.RoamRTT = µs(percentile(plainLat, 0.5)), µs(percentile(roamLat, 0.5))
	// By Spot ID and by PID in one loop, each first every other time (the
	// second of two calls finds the goroutines it needs awake): both see
	// the same machine.
	idLat, pidLat := make([]time.Duration, 0, requests), make([]time.Duration, 0, requests)
	for i := 0; i < requests; i++ {
		first, second := func() error { return timed(byID, &idLat) }, func() error { return timed(byPID(remoteRoam), &pidLat) }
		if i%2 == 1 {
			first, second = second, first
		}
		if err := first(); err != nil {
			return row, err
		}
		if err := second(); err != nil {
			return row, err
		}
	}
	row.IDP50, row.IDP99 = µs(percentile(idLat, 0.5)), µs(percentile(idLat, 0.99))
	row.PIDP50, row.PIDP99 = µs(percentile(pidLat, 0.5)), µs(percentile(pidLat, 0.99))
	rate := func(pid *actor.PID) (float64, error) {
		start := time.Now()
		for i := 0; i < sends; i++ {
			root.Send(pid, wrapperspb.UInt64(uint64(i)))
		}
		if _, err := root.RequestFuture(pid, wrapperspb.String("count"), 60*time.Second).Result(); err != nil {
			return 0, err
		}
		return float64(sends) / time.Since(start).Seconds(), nil
	}
	// Throughput swings with the machine's other load: rounds of each
	// alternate, and each figure is its rounds' median.
	var plainRates, roamRates, idRates, pidRates, idCPU, pidCPU []float64
	for round := 0; round < 3; round++ {
		r, err := rate(remotePlain)
		if err != nil {
			return row, err
		}
		plainRates = append(plainRates, r)
		if r, err = rate(remoteRoam); err != nil {
			return row, err
		}
		roamRates = append(roamRates, r)
	}
	// Requests by Spot ID and by PID: five rounds of each, alternating,
	// each first every other round.
	for round := 0; round < requestRounds; round++ {
		for k := 0; k < 2; k++ {
			byIDNow := (round+k)%2 == 0
			call := byPID(remoteRoam)
			if byIDNow {
				call = byID
			}
			r, cpu, err := callRate(requestCallers, 2*requests, call)
			if err != nil {
				return row, err
			}
			if byIDNow {
				idRates, idCPU = append(idRates, r), append(idCPU, µs(cpu))
			} else {
				pidRates, pidCPU = append(pidRates, r), append(pidCPU, µs(cpu))
			}
		}
	}
	row.PlainRate, row.RoamRate = median(plainRates), median(roamRates)
	row.IDRate, row.PIDRate = median(idRates), median(pidRates)
	row.IDCPU, row.PIDCPU = median(idCPU), median(pidCPU)
	return row, nil
}

// callRate makes n calls by callers goroutines, each calling again as
// soon as its call returns; calls per second, and the process's CPU time
// per call (both nodes: caller and callee).
func callRate(callers, n int, call func() error) (rate float64, cpu time.Duration, err error) {
	start, cpu0 := time.Now(), cpuTime()
	if err := forEach(n, callers, func(int) error { return call() }); err != nil {
		return 0, 0, err
	}
	return float64(n) / time.Since(start).Seconds(), (cpuTime() - cpu0) / time.Duration(n), nil
}

// drainRow is scenario (e): one node of three drained, runs times.
type drainRow struct {
	Units, Runs   int
	Moved, Failed int     // over all runs
	Rate          float64 // units/s, the median run's
	P50, P99      float64 // ms, per unit, medians over runs
	Lost          int     // units whose state did not arrive, over all runs
	StoppedLost   int     // the baseline: units lost when the node simply stops (once)
	Calls         float64 // store calls of every node per unit moved, during the drain (medians over runs)
	CallsByMethod string  // the first run's, per unit, by method
}

// drainNode activates n Spots on node 0 of three, sends each one numbered
// message, drains node 0 and asks every Spot on the others whether it
// still counts it; runs times, each in a fresh world. The baseline stops
// node 0 instead, once. With profile set, the CPU profile of the first
// run's drain (nothing else) goes there.
func drainNode(ctx context.Context, newStore func() (location.Store, error), n, runs int, profile string) (drainRow, error) {
	row := drainRow{Units: n, Runs: runs}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("drain-%d", i)
	}
	byCall := &callCounts{}
	counting := func() (location.Store, error) {
		st, err := newStore()
		if err != nil {
			return nil, err
		}
		return &countingStore{Store: st, calls: new(atomic.Int64), byCall: byCall}, nil
	}
	prepare := func() (*world, func(), error) {
		w, done, err := openWorld(ctx, counting, 3)
		if err != nil {
			return nil, nil, err
		}
		err = each(ids, 32, func(id string) error {
			if _, err := w.nodes[0].SpawnInstanceSpot(ctx, "blob", id); err != nil {
				return err
			}
			_, err := w.nodes[0].Spots().Send(id, wrapperspb.UInt64(1)).Do(ctx)
			return err
		})
		if err != nil {
			done()
			return nil, nil, err
		}
		// Idle Spots, as a drain mostly finds them: the first checkpoint
		// of each (the default policy's, up to a second after its message)
		// written before the drain starts, not counted against it.
		checkpointCalls := func() int64 {
			n := byCall.snapshot()
			return n["GetCheckpoint"] + n["PutCheckpoint"]
		}
		last := checkpointCalls()
		for quiet := 0; quiet < 6; {
			select {
			case <-ctx.Done():
				done()
				return nil, nil, ctx.Err()
			case <-time.After(250 * time.Millisecond):
			}
			if now := checkpointCalls(); now == last {
				quiet++
			} else {
				last, quiet = now, 0
			}
		}
		return w, done, nil
	}
	counted := func(w *world) int {
		var mu sync.Mutex
		kept := 0
		_ = each(ids, 32, func(id string) error {
			if c, err := count(ctx, w.nodes[1], id); err == nil && c == 1 {
				mu.Lock()
				kept++
				mu.Unlock()
			}
			return nil
		})
		return kept
	}
	var rates, p50s, p99s, calls []float64
	for r := 0; r < runs; r++ {
		w, done, err := prepare()
		if err != nil {
			return row, err
		}
		stopProfile, err := startProfile(profile, r == 0)
		if err != nil {
			done()
			return row, err
		}
		before := byCall.snapshot()
		res, err := w.nodes[0].Drain(ctx, drain.Options{})
		stopProfile()
		if err != nil {
			done()
			return row, err
		}
		after := byCall.snapshot()
		var total int64
		for k, v := range after {
			total += v - before[k]
		}
		calls = append(calls, float64(total)/float64(max(res.Moved, 1)))
		if r == 0 {
			row.CallsByMethod = perUnit(after, before, max(res.Moved, 1))
		}
		row.Moved += res.Moved
		row.Failed += len(res.Failed)
		rates = append(rates, float64(res.Moved)/res.Finished.Sub(res.Started).Seconds())
		p50s, p99s = append(p50s, ms(res.PauseP50)), append(p99s, ms(res.PauseP99))
		row.Lost += n - counted(w)
		done()
	}
	row.Rate, row.P50, row.P99, row.Calls = median(rates), median(p50s), median(p99s), median(calls)

	w, done, err := prepare()
	if err != nil {
		return row, err
	}
	defer done()
	if err := w.nodes[0].StopNow(ctx); err != nil {
		return row, err
	}
	row.StoppedLost = n - counted(w)
	return row, nil
}

// startProfile starts a CPU profile into path when on and path is set;
// the returned func stops it. The allocations profiles path.allocs-before
// and path.allocs, taken at start and stop, give the drain's allocations
// (go tool pprof -base path.allocs-before path.allocs).
func startProfile(path string, on bool) (func(), error) {
	if path == "" || !on {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	writeAllocs := func(to string) {
		runtime.GC() // the allocs profile is as of the last collection
		if a, err := os.Create(to); err == nil {
			_ = pprof.Lookup("allocs").WriteTo(a, 0)
			_ = a.Close()
		}
	}
	writeAllocs(path + ".allocs-before")
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
		writeAllocs(path + ".allocs")
	}, nil
}

// spotWideRow is scenario (f) for one member count on one store: the
// medians, over runs, of each run's pause p50 and p99 of a SpotWide User
// Spot moved with its members, and the largest pause.
type spotWideRow struct {
	Members       int
	P50, P99, Max float64 // ms
	Moves         int
}

// spotWidePause moves a SpotWide User Spot with members members (each with
// size bytes of state) back and forth between two nodes; the pause is the
// unit's, seal of the first participant on the source → the Spot's
// dispatch open on the target (one Event per move).
func spotWidePause(ctx context.Context, newStore func() (location.Store, error), members, size, runs, moves int) (spotWideRow, error) {
	row := spotWideRow{Members: members}
	var pr pauseRuns
	for r := 0; r < runs; r++ {
		w, done, err := openWorld(ctx, newStore, 2)
		if err != nil {
			return row, err
		}
		id := fmt.Sprintf("crew-%d-%d", members, r)
		res, err := w.nodes[0].Spots().GetOrCreate(id, "crew").Do(ctx)
		if err != nil {
			done()
			return row, err
		}
		home := 0
		if res.Ref.NodeRid != w.nodes[0].NodeRid() {
			home = 1
		}
		for i := 0; i < members; i++ {
			pid, err := w.nodes[home].Spots().SpawnMember(ctx, res.Ref, "blob", fmt.Sprintf("%s-m%d", id, i))
			if err != nil {
				done()
				return row, err
			}
			if _, err := w.nodes[home].System().Root.RequestFuture(pid, wrapperspb.Int64(int64(size)), 30*time.Second).Result(); err != nil {
				done()
				return row, err
			}
		}
		for m := 0; m < moves; m++ {
			from, to := w.nodes[(home+m)%2], w.nodes[(home+m+1)%2]
			if _, err := from.Relocate(ctx, extension.UserSpotRef(id), to.NodeRid()); err != nil {
				done()
				return row, fmt.Errorf("move %d of %s: %w", m, id, err)
			}
		}
		// Relocate returns once the commit shows; the target reports its
		// pause when its dispatch opens, just after.
		for wait := time.Now().Add(5 * time.Second); w.pauseCount() < moves && time.Now().Before(wait); {
			time.Sleep(time.Millisecond)
		}
		pr.add(w.takePauses())
		done()
	}
	row.Moves, row.P50, row.P99, row.Max = pr.figures()
	return row, nil
}
