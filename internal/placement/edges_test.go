package placement

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/location"
)

func actor(id string) location.AuthorityKey { return location.Key(location.KindActor, id) }

func everywhere(location.AuthorityKey) bool { return true }

// The table counts samples per (sender, receiver), keeps the sender's last
// node, and answers the heaviest first, at most max.
func TestEdgeTableCountsAndAnswersTheHeaviest(t *testing.T) {
	now := time.Unix(1000, 0)
	tb := NewEdgeTable(100, time.Minute)
	for i := range 5 {
		tb.Record(actor("a"), "n1", actor("b"), now)
		if i < 2 {
			tb.Record(actor("c"), "n2", actor("b"), now)
		}
	}
	tb.Record(actor("a"), "n3", actor("b"), now) // a moved to n3
	got := Heaviest(tb.Snapshot(everywhere, now), 10)
	require.Equal(t, []Edge{{From: actor("a"), To: actor("b"), FromNode: "n3", Weight: 6}, {From: actor("c"), To: actor("b"), FromNode: "n2", Weight: 2}}, got)
	require.Len(t, Heaviest(tb.Snapshot(everywhere, now), 1), 1)
}

// A receiver that is no longer here is forgotten at the next snapshot: its
// new node counts it.
func TestEdgeTableForgetsReceiversThatLeft(t *testing.T) {
	now := time.Unix(1000, 0)
	tb := NewEdgeTable(100, time.Minute)
	tb.Record(actor("a"), "n1", actor("b"), now)
	tb.Record(actor("a"), "n1", actor("c"), now)
	got := tb.Snapshot(func(k location.AuthorityKey) bool { return k != actor("c") }, now)
	require.Len(t, got, 1)
	require.Equal(t, 1, tb.Len())
}

// Weights halve every half-life, and what falls below half a sample goes.
func TestEdgeTableDecays(t *testing.T) {
	now := time.Unix(1000, 0)
	tb := NewEdgeTable(100, time.Minute)
	for range 8 {
		tb.Record(actor("a"), "n1", actor("b"), now)
	}
	tb.Record(actor("x"), "n1", actor("b"), now)
	got := tb.Snapshot(everywhere, now.Add(2*time.Minute))
	require.Equal(t, []Edge{{From: actor("a"), To: actor("b"), FromNode: "n1", Weight: 2}}, got, "8 → 2; x's one sample → 0.25, gone")
	got = tb.Snapshot(everywhere, now.Add(time.Minute)) // the clock went back: no decay, no growth
	require.Equal(t, 2.0, got[0].Weight)
}

// A full table never holds more than its bound; the edges that carry
// traffic stay, one-off senders go.
func TestEdgeTableIsBounded(t *testing.T) {
	now := time.Unix(1000, 0)
	tb := NewEdgeTable(64, time.Hour)
	for range 10 {
		tb.Record(actor("heavy"), "n1", actor("b"), now)
	}
	for i := range 1000 {
		tb.Record(actor(fmt.Sprintf("once-%d", i)), "n1", actor("b"), now)
		require.LessOrEqual(t, tb.Len(), 64)
	}
	got := Heaviest(tb.Snapshot(everywhere, now), 1)
	require.Equal(t, actor("heavy"), got[0].From)
}

// A large table is split by receiver: still bounded as a whole, every
// sample recorded concurrently is counted once, and the heavy senders of
// every receiver stay.
func TestLargeEdgeTableIsBoundedAndCountsEverySample(t *testing.T) {
	now := time.Unix(1000, 0)
	tb := NewEdgeTable(2048, time.Hour)
	var wg sync.WaitGroup
	for g := range 8 { // receivers r0..r7 on their own goroutines, as turns are
		wg.Add(1)
		go func() {
			defer wg.Done()
			to := actor(fmt.Sprintf("r%d", g))
			for i := range 3000 {
				tb.Record(actor("heavy"), "n1", to, now)
				tb.Record(actor(fmt.Sprintf("once-%d-%d", g, i)), "n1", to, now)
				tb.RecordLoad(to, now)
			}
		}()
	}
	wg.Wait()
	require.LessOrEqual(t, tb.Len(), 2048)
	heavy := 0
	for _, e := range tb.Snapshot(everywhere, now) {
		if e.From == actor("heavy") {
			heavy++
			require.Greater(t, e.Weight, 2.0, "a heavy edge outweighs the one-off ones it was halved with")
		}
	}
	require.Equal(t, 8, heavy, "every receiver keeps its heavy sender")
	loads := tb.Loads(everywhere, now)
	require.Len(t, loads, 8)
	for _, l := range loads {
		require.Equal(t, 3000.0, l.Weight, "every load sample counted once")
	}
}

// Loads are counted per object, forgotten when the object left, decay
// with the edges, and stay within the bound.
func TestEdgeTableLoads(t *testing.T) {
	now := time.Unix(1000, 0)
	tb := NewEdgeTable(8, time.Minute)
	for range 4 {
		tb.RecordLoad(actor("hot"), now)
	}
	tb.RecordLoad(actor("gone"), now)
	got := tb.Loads(func(k location.AuthorityKey) bool { return k != actor("gone") }, now)
	require.Equal(t, []Load{{Key: actor("hot"), Weight: 4}}, got)
	for i := range 100 {
		tb.RecordLoad(actor(fmt.Sprintf("once-%d", i)), now)
	}
	all := HeaviestLoads(tb.Loads(everywhere, now), 100)
	require.LessOrEqual(t, len(all), 8)
	require.Equal(t, actor("hot"), all[0].Key)
	require.Equal(t, 2.0, HeaviestLoads(tb.Loads(everywhere, now.Add(time.Minute)), 1)[0].Weight)
}
