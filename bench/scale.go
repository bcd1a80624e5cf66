package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
)

// scaleRow is scenario (i) for n idle Spots on one node of the embedded
// store: the live heap one costs beside a plain Proto.Actor actor's (the
// same actor type, spawned by name, one message handled), the store's
// record of it apart; how long a node's start takes over n records (its
// recovery scan); and a request's p99 to one Spot with n routes cached
// against 1,000.
type scaleRow struct {
	N                  int
	Plain, Spot, Store float64       // bytes of live heap per actor / per Spot (the node's) / per record with its checkpoint
	Start              time.Duration // the recovery scan
	Listing            time.Duration // the store's own listing of the same records (listAll)
	P99Few, P99Many    float64       // ms
	// PlainP99Few and PlainP99Many are the same requests to the plain
	// actors by PID: what the memory of a million objects costs a
	// request without roam (the peer of the ratio).
	PlainP99Few, PlainP99Many float64 // ms
}

// liveHeap is the live heap after a collection (runtime.GC returns once
// the cycle's sweep is done; nothing here waits on a finalizer, which a
// second cycle would take).
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// quiesced waits until the goroutines stop ending (an actor system's
// shutdown stops its actors in the background) and then collects once:
// what is timed next neither shares the CPU with that shutdown nor meets
// a collection of its garbage (the next collection is due when the heap
// has grown by as much as is live). A collection per look would take
// minutes with a million Spots live.
func quiesced() {
	last := runtime.NumGoroutine()
	for steady := 0; steady < 3; {
		time.Sleep(100 * time.Millisecond)
		now := runtime.NumGoroutine()
		if now < last {
			steady = 0
		} else {
			steady++
		}
		last = now
	}
	runtime.GC()
}

// settledHeap waits until the live heap stops shrinking (memory freed in
// the background, as by an actor system's shutdown) and returns it. Each
// look collects twice: for small heaps, or where the heap is measured.
func settledHeap() uint64 {
	last := liveHeap()
	for steady := 0; steady < 3; {
		time.Sleep(100 * time.Millisecond)
		now := liveHeap()
		if now+now/100 >= last {
			steady++
		} else {
			steady = 0
		}
		last = now
	}
	return last
}

// plainHeap spawns n plain actors by name, each handling one message, and
// returns the live heap each costs, and the request p99 to them among the
// first 1,000 and among all (requestP99, by PID).
func plainHeap(ctx context.Context, n int) (per, p99Few, p99Many float64, err error) {
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.NewTextHandler(discard{}, nil))
	}))
	defer sys.Shutdown()
	props := actor.PropsFromProducer(func() actor.Actor { return &blob{} })
	// What earlier sections freed in the background would count against
	// the actors.
	before := settledHeap()
	pids := make([]*actor.PID, n)
	for i := range pids {
		pid, err := sys.Root.SpawnNamed(props, spotName(i))
		if err != nil {
			return 0, 0, 0, err
		}
		pids[i] = pid
	}
	// By 32 callers, as the Spots are activated.
	if err := forEach(n, 32, func(i int) error {
		_, err := sys.Root.RequestFuture(pids[i], wrapperspb.Int64(0), 10*time.Second).Result()
		return err
	}); err != nil {
		return 0, 0, 0, err
	}
	per = float64(liveHeap()-before) / float64(n)
	request := func(id string) error {
		_, err := sys.Root.RequestFuture(actor.NewPID(sys.Address(), id), wrapperspb.Int64(0), 10*time.Second).Result()
		return err
	}
	if p99Few, err = requestP99(ctx, request, min(n, 1000)); err == nil {
		p99Many, err = requestP99(ctx, request, n)
	}
	runtime.KeepAlive(pids)
	return per, p99Few, p99Many, err
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func spotName(i int) string { return fmt.Sprintf("idle-%07d", i) }

// scale measures scenario (i) for n Spots.
func scale(ctx context.Context, n int) (scaleRow, error) {
	row := scaleRow{N: n}
	var err error
	// Each phase's wall time on stderr: the section is make bench's
	// longest, and this says where its minutes go.
	mark := time.Now()
	phase := func(name string) {
		fmt.Fprintf(os.Stderr, "  (i) %s: %v\n", name, time.Since(mark).Round(time.Millisecond))
		mark = time.Now()
	}
	defer phase("stop")
	if row.Plain, row.PlainP99Few, row.PlainP99Many, err = plainHeap(ctx, n); err != nil {
		return row, fmt.Errorf("plain: %w", err)
	}
	phase("plain actors")
	// The plain actors' system stops its actors in the background: what
	// it frees after the node's baseline would count against the Spots.
	settledHeap()
	phase("plain actors freed")
	store := memstore.New()
	defer store.Close()
	// Routes kept for the whole run, and room for all of them, so that
	// every one is cached (a route lives shorter than Message Follow; by
	// default a node caches 100,000).
	keepRoutes := func(c *extension.Config) {
		c.Relocation.Handoff = handoff.DefaultConfig()
		c.Relocation.Handoff.FollowDuration = 2 * time.Hour
		c.Spot.Routes.RouteCacheMaxAge = time.Hour
		c.Spot.Routes.RouteCacheMaxRoutes = n + 1
	}
	w, err := startWorld(ctx, store, 1, keepRoutes)
	if err != nil {
		return row, err
	}
	node := w.nodes[0]
	request := func(id string) error {
		_, err := node.Spots().Request(id, wrapperspb.Int64(0)).InstanceSpot("blob").Timeout(30 * time.Second).Do(ctx)
		return err
	}
	few := min(n, 1000)
	// A cold activation caches no route (the caller never read the Ready
	// record): the second call to each Spot reads it and caches it.
	for pass := 0; pass < 2; pass++ {
		if err := forEach(few, 32, func(i int) error { return request(spotName(i)) }); err != nil {
			w.stop(ctx)
			return row, err
		}
	}
	if row.P99Few, err = requestP99(ctx, request, few); err != nil {
		w.stop(ctx)
		return row, err
	}
	phase("first 1,000 and their p99")
	before := settledHeap()
	phase("settled before the rest")
	if err := forEach(n-few, 32, func(i int) error { return request(spotName(few + i)) }); err != nil {
		w.stop(ctx)
		return row, err
	}
	phase("activation of the rest")
	// The first checkpoint of each (the default policy's, up to a second
	// after its message) is part of what an idle Spot leaves: written
	// before the heap is measured, as the store's share counts it.
	if err := checkpointsWritten(ctx, store, n); err != nil {
		w.stop(ctx)
		return row, err
	}
	phase("checkpoints written")
	total := float64(liveHeap()-before) / float64(n-few)
	phase("heap after the rest")
	if path := os.Getenv("ROAM_BENCH_HEAP"); path != "" {
		if f, err := os.Create(path); err == nil {
			_ = pprof.Lookup("heap").WriteTo(f, 0)
			_ = f.Close()
		}
	}
	// Every route cached before the p99 over all, after the heap: the
	// Spots' figure holds none of them.
	if err := forEach(n, 32, func(i int) error { return request(spotName(i)) }); err != nil {
		w.stop(ctx)
		return row, err
	}
	phase("every route cached")
	if row.P99Many, err = requestP99(ctx, request, n); err != nil {
		w.stop(ctx)
		return row, err
	}
	phase("p99 over all")
	w.stop(ctx)
	phase("first node stopped")
	// The store's own share: its records and checkpoints of the Spots,
	// copied into a store of their own, once nothing else runs (a live
	// node's writes meanwhile counted in the copy's heap: the figure
	// moved by 100 bytes a Spot from run to run).
	quiesced()
	row.Store, err = storeHeap(ctx, store, n-few)
	if err != nil {
		return row, err
	}
	row.Spot = total - row.Store
	phase("store's copy")
	// The start-up recovery scan of a node restarted over the n records
	// (every one an ended owner's, with nothing to resume).
	w2, err := startWorld(ctx, store, 1)
	if err != nil {
		return row, err
	}
	phase("second node started")
	// A node starts its scan in a fresh process; here the first node's
	// incarnations are garbage by now, and a collection of them must not
	// run inside either timing. The listing first, in the same conditions.
	quiesced()
	phase("settled before the listing")
	if row.Listing, err = listAll(ctx, store); err != nil {
		w2.stop(ctx)
		return row, err
	}
	phase("listing")
	quiesced()
	phase("settled before the scan")
	if path := os.Getenv("ROAM_BENCH_SCANPROF"); path != "" {
		if f, err := os.Create(path); err == nil {
			_ = pprof.StartCPUProfile(f)
			defer func() { pprof.StopCPUProfile(); _ = f.Close() }()
		}
	}
	start := time.Now()
	if err := w2.nodes[0].Spots().Recover(ctx); err != nil {
		w2.stop(ctx)
		return row, err
	}
	row.Start = time.Since(start)
	phase("scan")
	w2.stop(ctx)
	return row, nil
}

// checkpointsWritten waits until the last Spots (i) activated have their
// checkpoints in store, and so, written in about the order of the
// activations, the others.
func checkpointsWritten(ctx context.Context, store *memstore.Store, n int) error {
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for i := n - 1; i >= max(0, n-1000); i-- {
		key := location.Key(location.KindInstanceSpot, spotName(i))
		for {
			if _, _, err := store.GetCheckpoint(wctx, key); err == nil {
				break
			} else if !errors.Is(err, location.ErrNotFound) {
				return err
			}
			select {
			case <-wctx.Done():
				return fmt.Errorf("waiting for the checkpoint of %s: %w", key.ID, wctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// listAll is the store's own listing of what the recovery scan pages
// through (every Instance Spot and User Spot record, in pages of
// the same size), and nothing else: the scan's floor.
func listAll(ctx context.Context, store location.Store) (time.Duration, error) {
	start := time.Now()
	for _, kind := range []location.Kind{location.KindInstanceSpot, location.KindUserSpot} {
		after := ""
		for {
			page, err := store.List(ctx, kind, location.PageRequest{Size: location.MaxPageSize, After: after})
			if err != nil {
				return 0, fmt.Errorf("listing: %w", err)
			}
			if page.Next == "" {
				break
			}
			after = page.Next
		}
	}
	return time.Since(start), nil
}

// storeHeap copies n records of the Instance Spot kind, and their
// checkpoints, into a fresh store and returns the live heap each costs
// there.
func storeHeap(ctx context.Context, from location.Store, n int) (float64, error) {
	var recs []location.Versioned
	after := ""
	for len(recs) < n {
		page, err := from.List(ctx, location.KindInstanceSpot, location.PageRequest{Size: location.MaxPageSize, After: after})
		if err != nil {
			return 0, err
		}
		recs = append(recs, page.Items...)
		if page.Next == "" {
			break
		}
		after = page.Next
	}
	recs = recs[:min(n, len(recs))]
	// A checkpointed kind's Spots keep their checkpoints in the store too
	// (the blob kind checkpoints, as PreserveStateWith does by default).
	cps, _ := from.(location.CheckpointStore)
	var states [][]byte
	if cps != nil {
		states = make([][]byte, len(recs))
		for i, v := range recs {
			data, _, err := cps.GetCheckpoint(ctx, v.Key)
			if err != nil && !errors.Is(err, location.ErrNotFound) {
				return 0, err
			}
			states[i] = data
		}
	}
	// Nothing else runs here: two collections measure it.
	before := liveHeap()
	to := memstore.New()
	for i, v := range recs {
		if _, err := to.CompareAndSet(ctx, v.Key, 0, v.Record); err != nil {
			return 0, err
		}
		if states != nil && states[i] != nil {
			if _, err := to.PutCheckpoint(ctx, v.Key, 0, states[i]); err != nil {
				return 0, err
			}
		}
	}
	// recs (the listed copies) count in before and still do here: what
	// grew is the store's own copies and index.
	per := float64(liveHeap()-before) / float64(n)
	runtime.KeepAlive(to)
	runtime.KeepAlive(recs)
	runtime.KeepAlive(states)
	return per, nil
}

// requestP99 is the median over three rounds of the p99 of 10,000 requests
// to Spots drawn among the first n, one after another (the 100th slowest:
// with 2,000 the 20th moved from run to run more than the goal's margin).
// Each round starts right after a collection: what is timed is the call path, not a
// collection of the whole heap running beside it (its cost grows with the
// heap; the call path's must not grow with the routes).
func requestP99(ctx context.Context, request func(string) error, n int) (float64, error) {
	var p99s []float64
	for round := 0; round < 3; round++ {
		runtime.GC()
		lat := make([]time.Duration, 0, 10000)
		for i := 0; i < 10000; i++ {
			id := spotName((i*7919 + round*104729) % n)
			start := time.Now()
			if err := request(id); err != nil {
				return 0, err
			}
			lat = append(lat, time.Since(start))
		}
		p99s = append(p99s, ms(percentile(lat, 0.99)))
	}
	return median(p99s), nil
}
