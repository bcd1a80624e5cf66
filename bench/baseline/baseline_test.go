package baseline

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/roamactors/roam/location/consulstore/consultest"
)

// TestKillAndReactivateMeasuresPauseAndLoss moves a 1 KiB counter actor
// three times the Proto.Actor way against a real Consul and checks that
// every trial has a pause and a send count, that loss is within bounds,
// that the state (the counter of handled messages) survived every move, and
// that the run's Consul keys are gone afterwards.
func TestKillAndReactivateMeasuresPauseAndLoss(t *testing.T) {
	srv, err := consultest.Launch()
	if err != nil {
		t.Fatalf("start consul: %v", err)
	}
	t.Cleanup(srv.Stop)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	prefix := "roam-bench-baseline/test-" + time.Now().Format("150405.000000000")
	rep, err := Run(ctx, Config{ConsulAddr: srv.Addr, StateBytes: 1 << 10, Trials: 3, KeyPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 3 {
		t.Fatalf("%d results, want 3", len(rep.Results))
	}
	for i, r := range rep.Results {
		t.Logf("trial %d: pause %v (move %v) sent %d lost %d requests %d retried %d state %d B",
			i, r.Pause, r.Move, r.Sent, r.Lost, r.Requests, r.Retried, r.StateBytes)
		if r.Pause <= 0 {
			t.Errorf("trial %d: pause %v, want > 0", i, r.Pause)
		}
		if r.Sent <= 0 {
			t.Errorf("trial %d: sent %d, want > 0", i, r.Sent)
		}
		if r.Lost < 0 || r.Lost > r.Sent {
			t.Errorf("trial %d: lost %d of %d sent", i, r.Lost, r.Sent)
		}
		if r.Requests <= 0 || r.Retried < 0 || r.Retried > r.Requests {
			t.Errorf("trial %d: %d of %d requests retried", i, r.Retried, r.Requests)
		}
		if r.StateBytes != 1<<10 {
			t.Errorf("trial %d: state %d bytes, want 1024", i, r.StateBytes)
		}
	}
	if rep.Handled == 0 || rep.FinalCounter != rep.Handled {
		t.Errorf("state not preserved: counter %d after 3 moves, %d messages handled", rep.FinalCounter, rep.Handled)
	}

	client, err := api.NewClient(&api.Config{Address: srv.Addr})
	if err != nil {
		t.Fatal(err)
	}
	keys, _, err := client.KV().Keys(prefix+"/", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 0 {
		t.Errorf("keys left under %s: %v", prefix, keys)
	}
}

// TestKillAndReactivateSplitsLargeState moves a 1 MiB actor (its state is
// stored in two Consul values) and checks the public API keeps the state.
func TestKillAndReactivateSplitsLargeState(t *testing.T) {
	srv, err := consultest.Launch()
	if err != nil {
		t.Fatalf("start consul: %v", err)
	}
	t.Cleanup(srv.Stop)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	results, err := KillAndReactivate(ctx, srv.Addr, 1<<20, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 2 {
		t.Fatalf("%d results, want 2", len(results))
	}
	for i, r := range results {
		t.Logf("trial %d: pause %v (move %v) sent %d lost %d requests %d retried %d state %d B",
			i, r.Pause, r.Move, r.Sent, r.Lost, r.Requests, r.Retried, r.StateBytes)
		if r.Pause <= 0 || r.Sent <= 0 || r.Lost < 0 || r.Lost > r.Sent {
			t.Errorf("trial %d: %+v", i, r)
		}
	}
}

// TestPersistInStoppingKeepsState has the actor write its own state in its
// Stopping handler; the state must survive all the same.
func TestPersistInStoppingKeepsState(t *testing.T) {
	srv, err := consultest.Launch()
	if err != nil {
		t.Fatalf("start consul: %v", err)
	}
	t.Cleanup(srv.Stop)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := Run(ctx, Config{ConsulAddr: srv.Addr, StateBytes: 1 << 10, Trials: 2, PersistInStopping: true})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range rep.Results {
		t.Logf("trial %d: pause %v (move %v) sent %d lost %d requests %d retried %d",
			i, r.Pause, r.Move, r.Sent, r.Lost, r.Requests, r.Retried)
		if r.Pause <= 0 || r.Move <= 0 || r.Sent <= 0 || r.Lost > r.Sent {
			t.Errorf("trial %d: %+v", i, r)
		}
	}
	if len(rep.Results) != 2 || rep.Handled == 0 || rep.FinalCounter != rep.Handled {
		t.Errorf("%d results; counter %d after the moves, %d messages handled", len(rep.Results), rep.FinalCounter, rep.Handled)
	}
}

func TestBitset(t *testing.T) {
	var b bitset
	for _, i := range []uint64{1, 63, 64, 1000, 70000} {
		b.set(i)
	}
	for _, i := range []uint64{1, 63, 64, 1000, 70000} {
		if !b.has(i) {
			t.Errorf("%d missing", i)
		}
	}
	for _, i := range []uint64{0, 2, 65, 999, 1 << 40} {
		if b.has(i) {
			t.Errorf("%d present", i)
		}
	}
}
