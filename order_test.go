package roam_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/roamerr"
)

// handledLog is what a sequenced Spot handled, in handling order, over
// all its incarnations (one dispatches at a time).
type handledLog struct {
	mu   sync.Mutex
	vals []string
}

func (l *handledLog) add(v string) {
	l.mu.Lock()
	l.vals = append(l.vals, v)
	l.mu.Unlock()
}

func (l *handledLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.vals...)
}

// sequenced records every string it is sent and answers it.
type sequenced struct{ log *handledLog }

func (s *sequenced) Receive(c actor.Context) {
	if v, ok := c.Message().(*wrapperspb.StringValue); ok {
		s.log.add(v.GetValue())
		c.Respond(v)
	}
}

func (s *sequenced) CaptureState() ([]byte, error) { return nil, nil }
func (s *sequenced) RestoreState([]byte) error     { return nil }

// One Spot moves back and forth between two nodes as fast as two movers
// can move it, while two callers on a third node number their messages:
// four sends, then a request. Every message a caller saw accepted is
// handled once, and each caller's messages in the order it sent them:
// its sends before its next request too, whether they followed the old
// route, went past the follow hop limit, or waited for a route's drain.
// Bounded by the number of messages, not by time; a caller that stops
// progressing or a mover whose last Relocate does not end fails it within
// testwait's bound, naming what it waited for, with the stacks of the
// calls and moves. On a machine starved of CPU a node's 2 s lease may end
// meanwhile: its lifecycle ends, and with it what the Spot held there
// (docs/FAULTS.md), or the node is fenced by a late renewal. A caller
// then gets a typed Unavailable or DeadlineExceeded and stops; what it
// sent up to its last answered request was still handled once and in
// order, and nothing after what it sent last. A failed call while every
// lifecycle lasted unfenced fails the test.
// Reference: docs/PROTOCOL.md §7.8, §5.14 (order per sender).
func TestOneCallersOrderHoldsWhileTheSpotMovesContinuously(t *testing.T) {
	orderHoldsWhileMoving(t, 1000, nil, nil)
}

// The same with the callers' routes aging out after a millisecond: a
// route that left the cache without a hint while its Spot moved is
// drained before the new owner is used, with every call that took it
// still counted, and a concurrent call waits for that drain.
// Reference: docs/PROTOCOL.md §7.8 (RouteCacheMaxAge).
func TestOneCallersOrderHoldsWhenRoutesAgeOut(t *testing.T) {
	orderHoldsWhileMoving(t, 300, []roam.Option{roam.WithSpotConfig(roam.SpotConfig{RouteCacheMaxAge: time.Millisecond})}, nil)
}

// The same with the callers' node caching two routes, and each caller
// calling a Spot of its own before every message: of the three Spots one
// is always out of the cache, so the moving Spot's route is displaced by
// the bound again and again, and the table of routes waiting for their
// next resolve (as many as the bound) overflows again and again too. A
// displaced route is drained before a newer owner is used; one the table
// cannot keep is drained at once.
// Reference: docs/PROTOCOL.md §7.8 (RouteCacheMaxRoutes).
func TestOneCallersOrderHoldsPastTheRouteCacheBound(t *testing.T) {
	orderHoldsWhileMoving(t, 300, []roam.Option{roam.WithSpotConfig(roam.SpotConfig{RouteCacheMaxRoutes: 2})},
		func(c *roam.Roam, k int) error {
			_, err := c.Spots().Request(context.Background(), fmt.Sprintf("elsewhere-%d", k), wrapperspb.String("x"), roam.InstanceSpot("sequenced"))
			return err
		})
}

// orderHoldsWhileMoving is TestOneCallersOrderHoldsWhileTheSpotMovesContinuously
// with perCaller messages a caller, the callers' node started with
// callerOpts, and before (if not nil) called by caller k before each of
// its messages.
func orderHoldsWhileMoving(t *testing.T, perCaller int, callerOpts []roam.Option, before func(c *roam.Roam, k int) error) {
	const callers = 2
	ctx := context.Background()
	store := memstore.New()
	log := &handledLog{}
	kind := roam.NewKind("sequenced", actor.PropsFromProducer(func() actor.Actor { return &sequenced{log: log} }),
		roam.PreserveState(), roam.Instance())
	a, b := start(t, store, roam.WithKinds(kind)), start(t, store, roam.WithKinds(kind))
	c := start(t, store, append([]roam.Option{roam.WithKinds(kind)}, callerOpts...)...)
	const id = "ordered"
	ref := roam.InstanceSpotRef(id)
	_, err := a.Spots().Request(ctx, id, wrapperspb.String("first"), roam.InstanceSpot("sequenced"))
	require.NoError(t, err)
	if pid, err := c.Resolve(ctx, ref); err == nil && pid.Address == c.System().Address() {
		_, err = c.Relocate(ctx, ref, a.NodeRid())
		require.NoError(t, err)
	}

	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the moves' and calls' goroutines when it failed:\n%s", roamStacks())
		}
	})

	rids := []string{a.NodeRid(), b.NodeRid(), c.NodeRid()}
	// A node fenced by a late renewal holds and refuses calls without
	// its lifecycle ending: that is starvation too, not a defect.
	var fenced atomic.Bool
	for _, n := range []*roam.Roam{a, b, c} {
		require.NoError(t, roam.WatchLease(n, func(valid bool) {
			if !valid {
				fenced.Store(true)
			}
		}))
	}
	lifecyclesLasted := func() bool {
		return a.NodeRid() == rids[0] && b.NodeRid() == rids[1] && c.NodeRid() == rids[2] && !fenced.Load()
	}
	stop := make(chan struct{})
	var moves atomic.Int64
	var movers sync.WaitGroup
	for _, to := range []*roam.Roam{a, b} {
		movers.Add(1)
		go func() {
			defer movers.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if out, err := c.Relocate(ctx, ref, to.NodeRid()); err == nil && out.From != out.To {
					moves.Add(1)
				}
			}
		}()
	}
	errs := make([]error, callers)
	answered := make([]int, callers)      // the last request answered
	sent := make([]atomic.Int64, callers) // the last message sent, answered or not
	var wg sync.WaitGroup
	for k := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := 1; seq <= perCaller; seq++ {
				v := wrapperspb.String(fmt.Sprintf("c%d:%d", k, seq))
				var err error
				if before != nil {
					if err = before(c, k); err != nil {
						errs[k] = fmt.Errorf("caller %d, before message %d: %w", k, seq, err)
						return
					}
				}
				sent[k].Store(int64(seq))
				request := seq%5 == 0 || seq == perCaller
				if request {
					_, err = c.Spots().Request(ctx, id, v)
				} else {
					err = c.Spots().Send(ctx, id, v)
				}
				if err != nil {
					errs[k] = fmt.Errorf("caller %d, message %d: %w", k, seq, err)
					return
				}
				if request {
					answered[k] = seq
				}
			}
		}()
	}
	// Every call and every move ends within its own bound, so the callers
	// fail here naming where they stand once they stop progressing, and
	// the movers once their last Relocate does not end.
	callersDone := doneWhen(&wg)
	for !closed(callersDone) {
		at := fmt.Sprint(sentSoFar(sent))
		testwait.For(t, func() bool { return closed(callersDone) || fmt.Sprint(sentSoFar(sent)) != at },
			"the callers to progress past the messages they sent so far, "+at)
	}
	close(stop)
	moversDone := doneWhen(&movers)
	testwait.For(t, func() bool { return closed(moversDone) }, "the movers' last Relocate calls to end")
	for _, err := range errs {
		if err == nil {
			continue
		}
		// A call held or lost with a lifecycle that ended or was fenced
		// fails typed: Unavailable, or DeadlineExceeded when no answer
		// came by its deadline ("may or may not have run").
		typed := errors.Is(err, roamerr.ErrUnavailable) || errors.Is(err, roamerr.ErrDeadlineExceeded)
		lasted := lifecyclesLasted()
		require.True(t, typed && !lasted, "a call failed (typed: %v; every lifecycle lasted unfenced: %v): %v", typed, lasted, err)
		t.Logf("a lifecycle ended or was fenced under load: %v", err)
	}
	t.Logf("%d moves", moves.Load())

	// Each caller's last message was a request, answered: everything it
	// sent before has been handled.
	next := make([]int, callers)
	for k := range next {
		next[k] = 1
	}
	for _, h := range log.all() {
		kk, seq, ok := strings.Cut(strings.TrimPrefix(h, "c"), ":")
		if !ok {
			continue
		}
		k, _ := strconv.Atoi(kk)
		n, _ := strconv.Atoi(seq)
		if next[k] <= answered[k] {
			require.Equal(t, next[k], n, "caller %d: message %d handled when %d was due (moves: %d)", k, n, next[k], moves.Load())
		} else {
			// Past its last answered request, a caller whose Spot's
			// lifecycle ended may have lost what that lifecycle held, but
			// nothing comes twice or out of order.
			require.GreaterOrEqual(t, n, next[k], "caller %d: message %d handled again or out of order (moves: %d)", k, n, moves.Load())
			require.LessOrEqual(t, int64(n), sent[k].Load(), "caller %d: message %d handled but never sent", k, n)
		}
		next[k] = n + 1
	}
	for k := range next {
		require.Greater(t, next[k], answered[k], "caller %d: every message up to its last answered request handled", k)
		if errs[k] == nil {
			require.Equal(t, perCaller+1, next[k], "caller %d: every message handled", k)
		}
	}
}

// doneWhen is closed once wg's goroutines have all ended.
func doneWhen(wg *sync.WaitGroup) <-chan struct{} {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	return done
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// sentSoFar is the last message each caller sent.
func sentSoFar(sent []atomic.Int64) []int64 {
	at := make([]int64, len(sent))
	for k := range sent {
		at[k] = sent[k].Load()
	}
	return at
}

// roamStacks is the stacks of the goroutines in this test or in a move:
// which call a stuck mover or caller waits in, and what its owner does.
func roamStacks() string {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "order_test.go") || strings.Contains(g, "internal/relocation.(*Driver)") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}
