package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/location"
)

// activationRow is scenario (h) on one store: cold activations (the first
// request to a Missing Instance Spot, to its reply) one after another and
// by 32 concurrent callers, beside the store's own round trips and
// Proto.Actor's own grain activation measured in the same run; Calls is
// how many store calls one activation makes on all nodes, its reply's
// critical path and the clean-up after it together.
type activationRow struct {
	P50, P99  float64 // ms, medians over runs
	RoundTrip float64 // ms, p50 of one consistent read, median over runs
	Txn       float64 // ms, p50 of one store transaction (the floor's CAS probe), median over runs
	Rate      float64 // activations/s by 32 callers, median over runs
	Calls     float64 // store calls per activation (sequential runs)
	// Proto.Actor's grain activation in the same runs (grainActivations):
	// its p50 and rate, and the median over runs of each run's roam rate
	// divided by its grain rate.
	GrainP50, GrainRate, RateRatio float64
}

// coldActivations activates n fresh Instance Spots one after another from
// node 0 of two (placement picks either node), then total more by
// callers concurrent callers; the store's round trips are measured in the
// same run (consistent reads of a missing key, and the transaction the
// floor of (a) uses), and grains(run) is Proto.Actor's grain activation
// of the same run.
func coldActivations(ctx context.Context, newStore func() (location.Store, error), runs, n, total, callers int, grains func(run int) (grainRow, error)) (activationRow, error) {
	var p50s, p99s, trips, txns, rates, calls, grainP50s, grainRates, ratios []float64
	for r := 0; r < runs; r++ {
		store, err := newStore()
		if err != nil {
			return activationRow{}, err
		}
		counted := &countingStore{Store: store, calls: new(atomic.Int64), trace: os.Getenv("ROAM_BENCH_TRACE") != ""}
		w, err := startWorld(ctx, counted, 2)
		if err != nil {
			_ = store.Close()
			return activationRow{}, err
		}
		row, err := coldActivationRun(ctx, w, counted, r, n, total, callers)
		w.stop(ctx)
		_ = store.Close()
		if err != nil {
			return activationRow{}, err
		}
		grain, err := grains(r)
		if err != nil {
			return activationRow{}, err
		}
		p50s, p99s, trips, txns, rates, calls = append(p50s, row.P50), append(p99s, row.P99), append(trips, row.RoundTrip), append(txns, row.Txn), append(rates, row.Rate), append(calls, row.Calls)
		grainP50s, grainRates, ratios = append(grainP50s, ms(grain.P50)), append(grainRates, grain.Rate), append(ratios, row.Rate/grain.Rate)
	}
	return activationRow{P50: median(p50s), P99: median(p99s), RoundTrip: median(trips), Txn: median(txns), Rate: median(rates), Calls: median(calls),
		GrainP50: median(grainP50s), GrainRate: median(grainRates), RateRatio: median(ratios)}, nil
}

func coldActivationRun(ctx context.Context, w *world, counted *countingStore, run, n, total, callers int) (activationRow, error) {
	activate := func(id string) error {
		_, err := w.nodes[0].Spots().Request(id, wrapperspb.Int64(8)).InstanceSpot("blob").Timeout(30 * time.Second).Do(ctx)
		return err
	}
	// warm the route to both nodes and the placement's view of them
	for i := 0; i < 10; i++ {
		if err := activate(fmt.Sprintf("warm-%d-%d", run, i)); err != nil {
			return activationRow{}, err
		}
	}
	var trips []time.Duration
	for i := 0; i < n; i++ {
		start := time.Now()
		if _, err := counted.Store.Read(ctx, location.AuthorityKey{Kind: location.KindInstanceSpot, ID: fmt.Sprintf("absent-%d", i)}); err != nil && !errors.Is(err, location.ErrNotFound) {
			return activationRow{}, err
		}
		trips = append(trips, time.Since(start))
	}
	probe, err := newCASProbe(ctx, counted.Store, location.AuthorityKey{Kind: location.KindInstanceSpot, ID: fmt.Sprintf("warm-%d-0", run)})
	if err != nil {
		return activationRow{}, err
	}
	defer probe.close()
	var txns []time.Duration
	for i := 0; i < n; i++ {
		d, err := probe.once(ctx)
		if err != nil {
			return activationRow{}, fmt.Errorf("transaction probe: %w", err)
		}
		txns = append(txns, d)
	}
	// Let the warm-up's clean-up (pointer removal, root delete) finish
	// before counting.
	if err := settleCalls(ctx, counted); err != nil {
		return activationRow{}, err
	}
	before := counted.calls.Load()
	lat := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		start := time.Now()
		counted.mark("activate")
		if err := activate(fmt.Sprintf("cold-%d-%d", run, i)); err != nil {
			return activationRow{}, err
		}
		lat = append(lat, time.Since(start))
		counted.mark("replied")
	}
	if err := settleCalls(ctx, counted); err != nil {
		return activationRow{}, err
	}
	perActivation := float64(counted.calls.Load()-before) / float64(n)

	start := time.Now()
	if err := forEach(total, callers, func(i int) error { return activate(fmt.Sprintf("many-%d-%d", run, i)) }); err != nil {
		return activationRow{}, err
	}
	elapsed := time.Since(start)
	return activationRow{P50: ms(percentile(lat, 0.5)), P99: ms(percentile(lat, 0.99)), RoundTrip: ms(percentile(trips, 0.5)),
		Txn: ms(percentile(txns, 0.5)), Rate: float64(total) / elapsed.Seconds(), Calls: perActivation}, nil
}

// settleCalls waits until the store calls stop (a lease renewal aside):
// the clean-up after an activation's reply runs in the background.
func settleCalls(ctx context.Context, counted *countingStore) error {
	last := counted.calls.Load()
	for quiet := 0; quiet < 3; {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if now := counted.calls.Load(); now == last {
			quiet++
		} else {
			last, quiet = now, 0
		}
	}
	return nil
}

// countingStore counts the store calls of every node on one store: the
// authority, Relocation Store and node-record calls an activation may make
// (lease renewals are not counted: they are not the activation's). Each
// node gets a client of its own where the store has clients, as separate
// processes would.
type countingStore struct {
	location.Store
	calls  *atomic.Int64 // shared by the clients of one store
	trace  bool
	byCall *callCounts // shared too; nil: not kept
}

// callCounts counts store calls by method.
type callCounts struct {
	mu sync.Mutex
	n  map[string]int64
}

func (c *callCounts) add(call string) {
	c.mu.Lock()
	if c.n == nil {
		c.n = map[string]int64{}
	}
	c.n[call]++
	c.mu.Unlock()
}

// snapshot returns the counts so far.
func (c *callCounts) snapshot() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.n)
}

// perUnit formats the counts since before, divided by units, largest
// first: "CompareAndSet 1.00, Read 2.00".
func perUnit(now, before map[string]int64, units int) string {
	type kv struct {
		k string
		v float64
	}
	var all []kv
	for k, v := range now {
		if d := v - before[k]; d > 0 {
			all = append(all, kv{k, float64(d) / float64(units)})
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].v > all[j].v || all[i].v == all[j].v && all[i].k < all[j].k })
	parts := make([]string, len(all))
	for i, e := range all {
		parts[i] = fmt.Sprintf("%s %.2f", e.k, e.v)
	}
	return strings.Join(parts, ", ")
}

func (c *countingStore) another() (location.Store, error) {
	cl, ok := c.Store.(clients)
	if !ok {
		return c, nil
	}
	s, err := cl.another()
	if err != nil {
		return nil, err
	}
	return &countingStore{Store: s, calls: c.calls, trace: c.trace, byCall: c.byCall}, nil
}

func (c *countingStore) Read(ctx context.Context, key location.AuthorityKey) (location.Versioned, error) {
	defer c.count("Read")()
	return c.Store.Read(ctx, key)
}

func (c *countingStore) CompareAndSet(ctx context.Context, key location.AuthorityKey, expected location.StoreVersion, rec *location.Record) (location.StoreVersion, error) {
	defer c.count("CompareAndSet")()
	return c.Store.CompareAndSet(ctx, key, expected, rec)
}

func (c *countingStore) Apply(ctx context.Context, ops []location.Op) ([]location.StoreVersion, error) {
	defer c.count("Apply")()
	return c.Store.Apply(ctx, ops)
}

func (c *countingStore) Watch(ctx context.Context, key location.AuthorityKey, after location.StoreVersion) (location.Versioned, error) {
	defer c.count("Watch")()
	return c.Store.Watch(ctx, key, after)
}

func (c *countingStore) LeaseAlive(ctx context.Context, id location.LeaseID) (bool, error) {
	defer c.count("LeaseAlive")()
	return c.Store.LeaseAlive(ctx, id)
}

func (c *countingStore) PutRoot(ctx context.Context, key string, data []byte) (location.RootRef, error) {
	defer c.count("PutRoot")()
	return c.Store.(location.RootStore).PutRoot(ctx, key, data)
}

func (c *countingStore) GetRoot(ctx context.Context, key string) ([]byte, location.RootRef, error) {
	defer c.count("GetRoot")()
	return c.Store.(location.RootStore).GetRoot(ctx, key)
}

func (c *countingStore) DeleteRoot(ctx context.Context, key string) error {
	defer c.count("DeleteRoot")()
	return c.Store.(location.RootStore).DeleteRoot(ctx, key)
}

// The checkpoint calls pass through, counted: a node finds the
// checkpoint store by asserting it on its store, and would run without
// checkpoints on a wrapper that hid them.
func (c *countingStore) GetCheckpoint(ctx context.Context, key location.AuthorityKey) ([]byte, location.StoreVersion, error) {
	defer c.count("GetCheckpoint")()
	return c.Store.(location.CheckpointStore).GetCheckpoint(ctx, key)
}

func (c *countingStore) PutCheckpoint(ctx context.Context, key location.AuthorityKey, expected location.StoreVersion, data []byte) (location.StoreVersion, error) {
	defer c.count("PutCheckpoint")()
	return c.Store.(location.CheckpointStore).PutCheckpoint(ctx, key, expected, data)
}

func (c *countingStore) DeleteCheckpoint(ctx context.Context, key location.AuthorityKey, expected location.StoreVersion) error {
	defer c.count("DeleteCheckpoint")()
	return c.Store.(location.CheckpointStore).DeleteCheckpoint(ctx, key, expected)
}

// ReadKeys passes through, counted as one call, where the store reads
// several keys in one round trip; elsewhere each key is a Read.
func (c *countingStore) ReadKeys(ctx context.Context, keys ...location.AuthorityKey) ([]location.Versioned, error) {
	kr, ok := c.Store.(location.KeysReader)
	if !ok {
		out := make([]location.Versioned, len(keys))
		for i, k := range keys {
			v, err := c.Read(ctx, k)
			if err != nil && !errors.Is(err, location.ErrNotFound) {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	}
	defer c.count("ReadKeys")()
	return kr.ReadKeys(ctx, keys...)
}

func (c *countingStore) CheckpointsInApply() bool {
	s, ok := c.Store.(location.CheckpointsInApply)
	return ok && s.CheckpointsInApply()
}

func (c *countingStore) InProcess() bool {
	s, ok := c.Store.(location.InProcess)
	return ok && s.InProcess()
}

func (c *countingStore) ReadNode(ctx context.Context, key location.NodeKey) (location.VersionedNode, error) {
	defer c.count("ReadNode")()
	return c.Store.ReadNode(ctx, key)
}

func (c *countingStore) ListNodes(ctx context.Context, mesh string) ([]location.VersionedNode, error) {
	defer c.count("ListNodes")()
	return c.Store.ListNodes(ctx, mesh)
}

func (c *countingStore) ListSlots(ctx context.Context, node location.NodeKey) ([]location.Slot, error) {
	defer c.count("ListSlots")()
	return c.Store.ListSlots(ctx, node)
}

// count counts a call; the function it returns marks the call's end.
func (c *countingStore) count(call string) func() {
	c.calls.Add(1)
	if c.byCall != nil {
		c.byCall.add(call)
	}
	c.mark("store " + call)
	return func() { c.mark("store " + call + " answered") }
}

func (c *countingStore) mark(what string) {
	if c.trace {
		fmt.Fprintf(os.Stderr, "%s %s\n", time.Now().Format("15:04:05.000000"), what)
	}
}
