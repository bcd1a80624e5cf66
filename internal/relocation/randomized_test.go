package relocation_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/roamerr"
)

// ledger records what it handled: per sender the last sequence number and
// the count, order violations, sends and request ids seen twice. A send
// that comes after a later one of its sender is out of order, not twice:
// Gaps keeps the numbers skipped so far, so that one arriving late is told
// from one handled again (the cutover-timeout path may deliver late
// records out of order, never twice: PROTOCOL.md §5.10).
type ledger struct {
	Last     map[uint32]uint32   `json:"last"`
	Count    map[uint32]uint32   `json:"count"`
	Gaps     map[uint32][]uint32 `json:"gaps,omitempty"`
	Disorder int                 `json:"disorder"`
	DupSends int                 `json:"dup_sends"`
	Requests map[uint64]bool     `json:"requests"`
	DupReqs  int                 `json:"dup_reqs"`
}

func newLedger() *ledger {
	return &ledger{Last: map[uint32]uint32{}, Count: map[uint32]uint32{}, Gaps: map[uint32][]uint32{}, Requests: map[uint64]bool{}}
}

// send counts one numbered send of sender.
func (l *ledger) send(sender, seq uint32) {
	switch last := l.Last[sender]; {
	case seq <= last && l.late(sender, seq):
		l.Disorder++
	case seq <= last:
		l.DupSends++
	case seq != last+1:
		l.Disorder++
		if l.Gaps == nil {
			l.Gaps = map[uint32][]uint32{}
		}
		for g := last + 1; g < seq; g++ {
			l.Gaps[sender] = append(l.Gaps[sender], g)
		}
	}
	if seq > l.Last[sender] {
		l.Last[sender] = seq
	}
	l.Count[sender]++
}

// late reports whether seq was skipped before (and is no longer).
func (l *ledger) late(sender, seq uint32) bool {
	gaps := l.Gaps[sender]
	for i, g := range gaps {
		if g == seq {
			l.Gaps[sender] = append(gaps[:i:i], gaps[i+1:]...)
			return true
		}
	}
	return false
}

func (l *ledger) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *wrapperspb.Int64Value: // a numbered send: sender<<32 | seq
		l.send(uint32(uint64(m.Value)>>32), uint32(m.Value))
	case *wrapperspb.UInt64Value: // a numbered request
		if l.Requests[m.Value] {
			l.DupReqs++
		}
		l.Requests[m.Value] = true
		// Answer with the id and the Message Follow hops the request took,
		// the hint a route cache uses to refresh a stale route.
		hops := uint64(0)
		if h := c.MessageHeader(); h != nil {
			n, _ := strconv.Atoi(h.Get(relocation.HeaderHops))
			hops = uint64(n)
		}
		c.Respond(wrapperspb.Bytes(binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, m.Value), hops)))
	case *wrapperspb.StringValue: // "stats"
		b, _ := json.Marshal(l)
		c.Respond(wrapperspb.Bytes(b))
	}
}

type ledgerState struct{}

func (ledgerState) Capture(a actor.Actor) ([]byte, error) { return json.Marshal(a.(*ledger)) }
func (ledgerState) Restore(a actor.Actor, b []byte) error { return json.Unmarshal(b, a.(*ledger)) }

// ledgerKind is the ledger as a PreserveStateWith kind.
var ledgerKind = relocation.Kind{StableType: "ledger", Producer: func() actor.Actor { return newLedger() }, Policy: relocation.PreserveStateWith(ledgerState{})}

func startLedgerNodes(t *testing.T, store location.Store, n int) []*testNode {
	var out []*testNode
	for i := 0; i < n; i++ {
		tn := startNodeWith(t, store, ledgerKind)
		out = append(out, tn)
	}
	return out
}

// Three nodes in one process, 20 objects, 1,000 random moves while 4
// senders send numbered sends and requests: every request is answered
// exactly once, every send handled exactly once, per-sender order kept,
// and the store names one owner, the one node serving the object.
// Reference: docs/PROTOCOL.md §4.2, §10 (nothing lost or handled twice,
// order per sender).
func TestRandomizedMovesKeepEveryMessageOnce(t *testing.T) {
	moves := 1000
	if s := os.Getenv("ROAM_RANDOM_MOVES"); s != "" {
		moves, _ = strconv.Atoi(s)
	}
	runRandomized(t, memstore.New(), moves)
}

// The same on a real Consul. Reference: as above, PROTOCOL.md §3.6.
func TestRandomizedMovesKeepEveryMessageOnceOnConsul(t *testing.T) {
	moves := 1000
	if s := os.Getenv("ROAM_RANDOM_MOVES"); s != "" {
		moves, _ = strconv.Atoi(s)
	}
	runRandomized(t, newConsulStore(t), moves)
}

// routeMaxAge bounds how long the senders keep a route: a third of the
// default Message Follow window.
var routeMaxAge = handoff.DefaultConfig().FollowDuration / 3

func runRandomized(t *testing.T, store location.Store, moves int) {
	const objects, senders = 20, 4
	nodes := startLedgerNodes(t, store, 3)
	ctx := context.Background()
	byRid := map[string]*testNode{}
	for _, n := range nodes {
		byRid[n.node.Descriptor().GetNodeRid()] = n
	}
	keys := make([]location.AuthorityKey, objects)
	for i := range keys {
		keys[i] = location.Key(location.KindActor, fmt.Sprintf("ledger-%02d", i))
		_, err := nodes[i%3].driver.Spawn(ctx, "ledger", keys[i].ID)
		require.NoError(t, err)
	}

	stop := make(chan struct{})
	var moved [objects]atomic.Int64
	var sent [senders][objects]uint32
	var requests atomic.Uint64
	var wg sync.WaitGroup
	errs := make(chan error, senders)
	for s := 0; s < senders; s++ {
		wg.Add(1)
		go func(s int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(s), 99))
			home := nodes[s%3]
			sys := home.node.System()
			type route struct {
				pid   *actor.PID
				uses  int
				moves int64     // moves of the object when the route was resolved
				at    time.Time // when it was resolved
			}
			routes := map[int]*route{}
			for {
				select {
				case <-stop:
					return
				default:
				}
				o := r.IntN(objects)
				rt := routes[o]
				if rt != nil && time.Since(rt.at) > routeMaxAge {
					// A route cache ages its routes out well inside Message
					// Follow's window: an incarnation that moved after the
					// route was read follows for FollowDuration, and then
					// answers Unavailable, loudly (PROTOCOL.md §5.14). On a
					// starved machine twenty objects' turns come round slowly.
					rt = nil
				}
				if rt == nil {
					p, err := home.driver.Resolve(ctx, keys[o])
					if err != nil {
						errs <- err
						return
					}
					rt = &route{pid: p, moves: moved[o].Load(), at: time.Now()}
				}
				pid := rt.pid
				for i := 0; i < 5; i++ {
					sent[s][o]++
					sys.Root.Send(pid, wrapperspb.Int64(int64(uint64(s)<<32|uint64(sent[s][o]))))
				}
				id := uint64(s)<<48 | requests.Add(1)
				res, err := sys.Root.RequestFuture(pid, wrapperspb.UInt64(id), 20*time.Second).Result()
				if err == nil {
					err = relocation.DeliveryError(res)
				}
				var hops uint64
				if err == nil {
					b := res.(*wrapperspb.BytesValue).Value
					if binary.BigEndian.Uint64(b) != id {
						err = fmt.Errorf("request %d answered with %v", id, res)
					}
					hops = binary.BigEndian.Uint64(b[8:])
				}
				if err != nil {
					errs <- fmt.Errorf("sender %d, %s (route used %d times, %d moves since it was resolved): %w",
						s, keys[o].ID, rt.uses, moved[o].Load()-rt.moves, err)
					return
				}
				// The answer came through this route after the sends before
				// it, so a fresh route cannot overtake them (order per
				// sender, PROTOCOL.md §10). Keep the
				// route for a few rounds, as a route cache would, and drop it
				// on the follow hint (hops), long before Message Follow could
				// pass its 8 hops.
				if rt.uses++; rt.uses < 3 && hops < 2 {
					routes[o] = rt
				} else {
					delete(routes, o)
				}
			}
		}(s)
	}

	r := rand.New(rand.NewPCG(7, 7))
	done := 0
	for attempts := 0; done < moves && attempts < moves*20; attempts++ {
		o := r.IntN(objects)
		key := keys[o]
		v, err := store.Read(ctx, key)
		require.NoError(t, err)
		from := byRid[v.Record.GetOwner().GetNodeRid()]
		var to *testNode
		for to == nil || to == from {
			to = nodes[r.IntN(3)]
		}
		_, err = from.driver.Relocate(ctx, key, to.node.Descriptor().GetNodeRid())
		switch {
		case err == nil:
			done++
			moved[o].Add(1)
		case errors.Is(err, roamerr.ErrNotFound), errors.Is(err, roamerr.ErrUnavailable):
			// The store named the new owner before it opened dispatch, or
			// the object is mid-move: try another.
		default:
			require.NoError(t, err)
		}
		select {
		case err := <-errs:
			require.NoError(t, err)
		default:
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, moves, done)

	for o, key := range keys {
		v, err := store.Read(ctx, key)
		require.NoError(t, err)
		owner := byRid[v.Record.GetOwner().GetNodeRid()]
		servingOn := 0
		for _, n := range nodes {
			ok, err := n.driver.Serving(ctx, key)
			require.NoError(t, err)
			if ok {
				servingOn++
				require.Same(t, owner, n, "%s serves on a node the store does not name", key.ID)
			}
		}
		require.Equal(t, 1, servingOn, "%s", key.ID)
		pid, err := owner.driver.Resolve(ctx, key)
		require.NoError(t, err)
		res, err := owner.node.System().Root.RequestFuture(pid, wrapperspb.String("stats"), 10*time.Second).Result()
		require.NoError(t, err)
		var l ledger
		require.NoError(t, json.Unmarshal(res.(*wrapperspb.BytesValue).Value, &l))
		require.Zero(t, l.DupSends, "%s: duplicated sends", key.ID)
		require.Zero(t, l.DupReqs, "%s: duplicated requests", key.ID)
		require.Zero(t, l.Disorder, "%s: per-sender order broken", key.ID)
		for s := 0; s < senders; s++ {
			require.Equal(t, sent[s][o], l.Count[uint32(s)], "%s: sends of sender %d", key.ID, s)
		}
	}
	for i, n := range nodes {
		kept, counted, err := relocation.LoadCounted(n.driver)
		require.NoError(t, err)
		require.Equal(t, counted, kept, "node %d: the load it keeps (serving, staging) against its incarnations counted", i)
	}
	t.Logf("%d moves, %d requests", done, requests.Load())
}

// The ledger tells a send handled again from one that came late.
func TestLedgerTellsLateFromTwice(t *testing.T) {
	l := newLedger()
	for _, seq := range []uint32{1, 2, 4, 3} {
		l.send(0, seq)
	}
	require.Equal(t, 2, l.Disorder, "4 skipped 3, and 3 came late")
	require.Zero(t, l.DupSends)
	require.Empty(t, l.Gaps[0])
	l.send(0, 3)
	l.send(0, 4)
	require.Equal(t, 2, l.DupSends, "3 and 4 were handled twice")
}
