package main

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

// The kinds of section (k): the blob with its checkpoints off, after every
// turn, and at most 100 ms after a change.
var (
	blobNever = extension.Kind{StableType: "blob-never", Instance: true, Producer: blobKind.Producer, Policy: blobKind.Policy, NoCheckpoints: true}
	blobTurn  = extension.Kind{StableType: "blob-turn", Instance: true, Producer: blobKind.Producer, Policy: blobKind.Policy, CheckpointEvery: 1}
	blob100ms = extension.Kind{StableType: "blob-100ms", Instance: true, Producer: blobKind.Producer, Policy: blobKind.Policy,
		CheckpointInterval: 100 * time.Millisecond}
)

// checkpointRow is section (k) on one store.
type checkpointRow struct {
	Never, Turn, Interval float64 // requests/s, medians over runs
	TurnRatio, IntRatio   float64 // medians of each run's ratio to never
	Written               float64 // checkpoints written per request, every turn (the writer coalesces)
	PutP50, CASP50        time.Duration
}

// checkpointThroughput runs closed-loop requesters (four, two per node)
// against one 1 KiB Spot of each kind in turn, in one world, phases of
// d/3 each, twice per run; and times 200 checkpoint writes of 1 KiB
// against 200 record compare-and-sets of the same store.
func checkpointThroughput(ctx context.Context, newStore func() (location.Store, error), runs int, d time.Duration) (checkpointRow, error) {
	var row checkpointRow
	var never, turn, interval, turnRatio, intRatio, written []float64
	for r := 0; r < runs; r++ {
		store, err := newStore()
		if err != nil {
			return row, err
		}
		w, err := startWorld(ctx, store, 2, func(c *extension.Config) { c.Kinds = append(c.Kinds, blobNever, blobTurn, blob100ms) })
		if err != nil {
			_ = store.Close()
			return row, err
		}
		rates := map[string][]float64{}
		var writes, turnRequests uint64
		for round := 0; round < 2; round++ {
			for _, k := range []extension.Kind{blobNever, blobTurn, blob100ms} {
				id := fmt.Sprintf("cp-%s-%d-%d", k.StableType, r, round)
				if _, err := w.nodes[0].Spots().Request(id, wrapperspb.Int64(1<<10)).InstanceSpot(k.StableType).Do(ctx); err != nil {
					w.stop(ctx)
					_ = store.Close()
					return row, err
				}
				before := w.written()
				n, err := closedLoop(ctx, w, id, d/3)
				if err != nil {
					w.stop(ctx)
					_ = store.Close()
					return row, err
				}
				if k.StableType == blobTurn.StableType {
					writes += w.written() - before
					turnRequests += n
				}
				rates[k.StableType] = append(rates[k.StableType], float64(n)/(d/3).Seconds())
			}
		}
		nv, tn, iv := median(rates[blobNever.StableType]), median(rates[blobTurn.StableType]), median(rates[blob100ms.StableType])
		never, turn, interval = append(never, nv), append(turn, tn), append(interval, iv)
		turnRatio, intRatio = append(turnRatio, tn/nv), append(intRatio, iv/nv)
		written = append(written, float64(writes)/float64(max(turnRequests, 1)))
		if r == 0 {
			row.PutP50, row.CASP50, err = putAgainstCAS(ctx, store, 200)
		}
		w.stop(ctx)
		_ = store.Close()
		if err != nil {
			return row, err
		}
	}
	row.Never, row.Turn, row.Interval = median(never), median(turn), median(interval)
	row.TurnRatio, row.IntRatio, row.Written = median(turnRatio), median(intRatio), median(written)
	return row, nil
}

// closedLoop has four requesters (two per node) call id for d and returns
// how many calls completed.
func closedLoop(ctx context.Context, w *world, id string, d time.Duration) (uint64, error) {
	completed, stop := requesters(ctx, w, id)
	time.Sleep(d)
	if err := stop(); err != nil {
		return 0, err
	}
	return completed.Load(), nil
}

// requesters starts four closed-loop requesters (two per node) calling id
// by Spot ID, counting the calls that completed; stop ends them and
// returns a requester's error, if one failed.
func requesters(ctx context.Context, w *world, id string) (completed *atomic.Uint64, stop func() error) {
	completed = &atomic.Uint64{}
	var failed atomic.Value
	done := make(chan struct{})
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			via := w.nodes[g%2]
			for {
				select {
				case <-done:
					return
				default:
				}
				if _, err := via.Spots().Request(id, wrapperspb.String("count")).Do(ctx); err != nil {
					failed.Store(err)
					return
				}
				completed.Add(1)
			}
		}()
	}
	return completed, func() error {
		close(done)
		wg.Wait()
		if err, _ := failed.Load().(error); err != nil {
			return fmt.Errorf("requester: %w", err)
		}
		return nil
	}
}

// putAgainstCAS times n checkpoint writes of 1 KiB (each a compare-and-set
// at the version the last returned) and n record compare-and-sets of the
// same store, interleaved; medians.
func putAgainstCAS(ctx context.Context, store location.Store, n int) (put, cas time.Duration, err error) {
	cps, ok := store.(location.CheckpointStore)
	if !ok {
		return 0, 0, fmt.Errorf("the store keeps no checkpoints")
	}
	data := make([]byte, 1<<10)
	key := location.Key(location.KindInstanceSpot, fmt.Sprintf("cp-latency-%d", time.Now().UnixNano()))
	rkey := location.Key(location.KindInstanceSpot, fmt.Sprintf("cas-latency-%d", time.Now().UnixNano()))
	rec := &location.Record{ObjectGeneration: 1, AuthorityOwnerGeneration: 1, State: messages.LifecycleState_LIFECYCLE_STATE_READY, StableType: "blob",
		Owner: &messages.Owner{Mesh: "bench", NodeRid: "bench", NodeGeneration: 1}}
	var cpv, rv location.StoreVersion
	var puts, cases []float64
	for i := 0; i < n; i++ {
		start := time.Now()
		if cpv, err = cps.PutCheckpoint(ctx, key, cpv, data); err != nil {
			return 0, 0, err
		}
		puts = append(puts, float64(time.Since(start)))
		start = time.Now()
		if rv, err = store.CompareAndSet(ctx, rkey, rv, rec); err != nil {
			return 0, 0, err
		}
		cases = append(cases, float64(time.Since(start)))
	}
	sort.Float64s(puts)
	sort.Float64s(cases)
	return time.Duration(puts[len(puts)/2]), time.Duration(cases[len(cases)/2]), nil
}

// written is how many checkpoints the world's nodes have stored.
func (w *world) written() uint64 {
	var n uint64
	for _, e := range w.nodes {
		_, st := e.CheckpointStats()
		n += st.Written
	}
	return n
}
