package relocation_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// request sends msg to pid with extra headers and returns the reply.
func request(t *testing.T, sys *actor.ActorSystem, pid *actor.PID, msg any, headers map[string]string) any {
	t.Helper()
	f := actor.NewFuture(sys, 10*time.Second)
	env := &actor.MessageEnvelope{Message: msg, Sender: f.PID()}
	for k, v := range headers {
		env.SetHeader(k, v)
	}
	sys.Root.Send(pid, env)
	res, err := f.Result()
	require.NoError(t, err)
	return res
}

// Message Follow keeps the sender and reply route: a request to the old
// address is answered by the new owner directly.
// Reference: docs/PROTOCOL.md §5.14, §4.2.
func TestMessageFollowAnswersFromTheNewOwner(t *testing.T) {
	c := startNodes(t, 2)
	ctx := context.Background()
	pid, err := c.nodes[0].driver.Spawn(ctx, "counter", "mf")
	require.NoError(t, err)
	_, err = c.nodes[0].driver.Relocate(ctx, location.Key(location.KindActor, "mf"), c.rid(1))
	require.NoError(t, err)
	c.nodes[0].node.System().Root.Send(pid, wrapperspb.Int64(1))
	require.Equal(t, int64(1), get(t, c.nodes[0].node.System(), pid))
}

// A followed message stamped with another ObjectGeneration is refused with
// InvalidOperation, not handled.
// Reference: PROTOCOL.md §5.14 (generation check).
func TestFollowGenerationMismatchIsInvalidOperation(t *testing.T) {
	c := startNodes(t, 1)
	pid, err := c.nodes[0].driver.Spawn(context.Background(), "counter", "gen")
	require.NoError(t, err)
	sys := c.nodes[0].node.System()
	res := request(t, sys, pid, wrapperspb.String("get"), map[string]string{relocation.HeaderGeneration: "99"})
	require.ErrorIs(t, relocation.DeliveryError(res), roamerr.ErrInvalidOperation)
	v, err := c.store.Read(context.Background(), location.Key(location.KindActor, "gen"))
	require.NoError(t, err)
	res = request(t, sys, pid, wrapperspb.String("get"), map[string]string{relocation.HeaderGeneration: strconv.FormatUint(v.Record.GetObjectGeneration(), 10)})
	require.NoError(t, relocation.DeliveryError(res))
}

// A message that Message Follow cannot take further (past 8 hops) is not
// dropped: the last stub looks the owner up in the store and delivers it
// there directly, a request with its reply route and sends in their order.
// Reference: PROTOCOL.md §5.14 (at most 8 hops, then the store); no silent drop.
func TestFollowPastEightHopsIsDeliveredFromTheStore(t *testing.T) {
	c := startNodes(t, 2)
	ctx := context.Background()
	first, err := c.nodes[0].driver.Spawn(ctx, "counter", "hops")
	require.NoError(t, err)
	key := location.Key(location.KindActor, "hops")
	for i := 0; i < relocation.MaxFollowHops+1; i++ {
		_, err := c.nodes[i%2].driver.Relocate(ctx, key, c.rid((i+1)%2))
		require.NoError(t, err)
	}
	sys := c.nodes[0].node.System()
	for i := int64(1); i <= 50; i++ {
		sys.Root.Send(first, wrapperspb.Int64(i)) // past the limit, one-way
	}
	// The request queues behind the sends: all 50 were handled, in order.
	require.Equal(t, int64(50), get(t, sys, first))
	// Seven hops back is still followed.
	res := request(t, sys, first, wrapperspb.String("get"), map[string]string{relocation.HeaderHops: strconv.Itoa(-2)})
	require.NoError(t, relocation.DeliveryError(res))
}

// A message past the hop limit whose object no longer exists fails loudly:
// a request gets NotFound.
// Reference: PROTOCOL.md §5.14; no silent drop.
func TestFollowPastTheLimitToAGoneObjectFailsTyped(t *testing.T) {
	store := newStore(t)
	a, b := startNodeConfig(t, store, relocation.Config{}, counterKind), startNodeConfig(t, store, relocation.Config{}, counterKind)
	ctx := context.Background()
	key := location.Key(location.KindActor, "gone")
	first, err := a.driver.Spawn(ctx, "counter", "gone")
	require.NoError(t, err)
	nodes := []*testNode{a, b}
	for i := 0; i < relocation.MaxFollowHops+1; i++ {
		_, err := nodes[i%2].driver.Relocate(ctx, key, nodes[(i+1)%2].node.Descriptor().GetNodeRid())
		require.NoError(t, err)
	}
	v, err := store.Read(ctx, key)
	require.NoError(t, err)
	_, err = store.Apply(ctx, []location.Op{location.DeleteOp(key, v.Version)})
	require.NoError(t, err)
	res := request(t, a.node.System(), first, wrapperspb.String("get"), nil)
	require.ErrorIs(t, relocation.DeliveryError(res), roamerr.ErrNotFound)
}

// A request dispatched after its caller's deadline is answered
// DeadlineExceeded and not run, so a target never runs requests whose
// callers gave up (the deadline travels in saved work).
// Reference: PROTOCOL.md §4.3 (roam-deadline), §5.5.
func TestRequestPastItsDeadlineIsNotRun(t *testing.T) {
	c := startNodes(t, 1)
	pid, err := c.nodes[0].driver.Spawn(context.Background(), "counter", "late")
	require.NoError(t, err)
	sys := c.nodes[0].node.System()
	sys.Root.Send(pid, wrapperspb.Int64(1))
	past := strconv.FormatInt(time.Now().Add(-time.Minute).UnixMilli(), 10)
	res := request(t, sys, pid, wrapperspb.String("get"), map[string]string{relocation.HeaderDeadline: past})
	require.ErrorIs(t, relocation.DeliveryError(res), roamerr.ErrDeadlineExceeded)
	future := strconv.FormatInt(time.Now().Add(time.Minute).UnixMilli(), 10)
	res = request(t, sys, pid, wrapperspb.String("get"), map[string]string{relocation.HeaderDeadline: future})
	require.NoError(t, relocation.DeliveryError(res))
	require.Equal(t, int64(1), res.(*wrapperspb.Int64Value).Value)

	// The same, named by the reply route instead of a header (a request
	// by Spot ID).
	for _, c := range []struct {
		deadline time.Time
		ran      bool
	}{{time.Now().Add(-time.Minute), false}, {time.Now().Add(time.Minute), true}} {
		replies := make(chan any, 1)
		route, ok := sys.ProcessRegistry.Add(replyTo(replies), relocation.ReplyRouteID("op-late", c.deadline))
		require.True(t, ok)
		sys.Root.Send(pid, &actor.MessageEnvelope{Message: wrapperspb.String("get"), Sender: route})
		var res any
		select {
		case res = <-replies:
		case <-time.After(testwait.Patience(t)):
			t.Fatal("no answer to the request")
		}
		sys.ProcessRegistry.Remove(route)
		if c.ran {
			require.NoError(t, relocation.DeliveryError(res))
		} else {
			require.ErrorIs(t, relocation.DeliveryError(res), roamerr.ErrDeadlineExceeded)
		}
	}
}

// replyTo is a reply address that passes what it receives to ch.
type replyTo chan any

func (r replyTo) SendUserMessage(_ *actor.PID, m any) {
	_, msg, _ := actor.UnwrapEnvelope(m)
	r <- msg
}
func (r replyTo) SendSystemMessage(*actor.PID, any) {}
func (r replyTo) Stop(*actor.PID)                   {}

// When MessageFollowDuration ends, the old address answers Unavailable.
// Reference: PROTOCOL.md §5.14 (MessageFollowDuration).
func TestFollowExpiresWithUnavailable(t *testing.T) {
	store := newStore(t)
	hc := handoff.DefaultConfig()
	hc.FollowDuration = 300 * time.Millisecond
	cfg := relocation.Config{Handoff: hc}
	a, b := startNodeConfig(t, store, cfg, counterKind), startNodeConfig(t, store, cfg, counterKind)
	ctx := context.Background()
	pid, err := a.driver.Spawn(ctx, "counter", "exp")
	require.NoError(t, err)
	_, err = a.driver.Relocate(ctx, location.Key(location.KindActor, "exp"), b.node.Descriptor().GetNodeRid())
	require.NoError(t, err)
	sys := a.node.System()
	deadline := time.Now().Add(testwait.Patience(t))
	for {
		err := relocation.DeliveryError(request(t, sys, pid, wrapperspb.String("get"), nil))
		if err != nil {
			require.ErrorIs(t, err, roamerr.ErrUnavailable)
			break
		}
		require.True(t, time.Now().Before(deadline), "follow never ended")
		time.Sleep(50 * time.Millisecond)
	}
}

// Without the cutover in time the target logs cutover_timeout, commits
// anyway, and a late cutover only logs late_cutover; every send of every
// sender is still handled exactly once. The source is held at relay-ready
// until the target has fallen back, and sends go to the sealed object
// meanwhile: the boundary batch is not empty and reaches the target only
// after it opened, as late records, which the sends held at the source
// since the cutover do not overtake.
// Reference: PROTOCOL.md §5.10, §12.1 item 24.
func TestCutoverTimeoutFallbackLosesNothing(t *testing.T) {
	store := newStore(t)
	logs := &logBuffer{}
	hc := handoff.DefaultConfig()
	hc.CutoverWaitTimeout = time.Nanosecond // the fallback fires as soon as the target is ready
	a := startNodeWith(t, store, perSenderKind)
	b := startNodeConfig(t, store, relocation.Config{Handoff: hc, Logger: logs.logger()}, perSenderKind)
	ready := holdAtRelayReady(t, a)
	batch := watchBatch(t, b)
	ctx := context.Background()
	key := location.Key(location.KindActor, "fb")
	pid, err := a.driver.Spawn(ctx, "per-sender", key.ID)
	require.NoError(t, err)
	root := a.node.System().Root
	const senders, phase = 4, 300
	// Each sender numbers its own sends; the senders run concurrently.
	send := func(from, to uint32) {
		var wg sync.WaitGroup
		for s := uint32(1); s <= senders; s++ {
			wg.Go(func() {
				for seq := from; seq <= to; seq++ {
					root.Send(pid, wrapperspb.Int64(int64(uint64(s)<<32|uint64(seq))))
				}
			})
		}
		wg.Wait()
	}
	send(1, phase) // before the seal: handled on a, or saved work
	moved := make(chan error, 1)
	go func() {
		_, err := a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
		moved <- err
	}()
	ready.wait(t)
	// No cutover can reach the target while its source is held.
	testwait.For(t, func() bool { return logs.has("cutover_timeout") }, "the target never fell back")
	send(phase+1, 2*phase) // sealed: the boundary batch
	ready.release()
	testwait.For(t, batch.cutoverArrived, "no cutover reached the target")
	send(2*phase+1, 3*phase) // after the relay: held until the commit shows, then Message Follow
	require.NoError(t, <-moved)

	var got perSender
	testwait.For(t, func() bool { got = perSenderStats(t, b, key); return got.total() >= senders*3*phase }, "not every send arrived")
	require.Equal(t, senders*phase, batch.records(), "the sends posted while sealed travel in the boundary batch")
	require.Len(t, got.Seqs, senders)
	for s := uint32(1); s <= senders; s++ {
		seqs := got.Seqs[s]
		seen := map[uint32]int{}
		for _, q := range seqs {
			seen[q]++
		}
		for q := uint32(1); q <= 3*phase; q++ {
			require.Equal(t, 1, seen[q], "sender %d: send %d handled %d times", s, q, seen[q])
		}
		require.Len(t, seqs, 3*phase, "sender %d: a send that was never sent was handled", s)
		// Order per sender holds across every way a send took: the state
		// and saved work first, then the batch's records, delivered late,
		// then the held sends, which follow only once the target has
		// acknowledged the batch (PROTOCOL.md §5.10, §5.13).
		for i, q := range seqs {
			require.EqualValues(t, i+1, q, "sender %d: send %d handled at %d", s, q, i)
		}
	}
	testwait.For(t, func() bool { return logs.has("late_cutover") }, "late cutover not logged")
}

// After a cutover fallback the target delivers the relayed records it
// lacked late, through its relocation actor, while a followed message goes
// straight to the object's queue: the source holds what arrived after the
// cutover until the target acknowledges the batch, not only until the
// commit shows, so a caller's request after its sends counts them all.
// Here the target falls back and commits while its source is held at
// relay-ready, and its relocation actor is then held at the first late
// record: the request, sent once the source has seen the commit (it closed
// the instance), must wait at the source, and is answered only after the
// records, with every send counted.
// Reference: PROTOCOL.md §5.10, §5.13, §5.14 (order per sender).
func TestHeldMessagesWaitForTheLateBoundaryRecords(t *testing.T) {
	store := newStore(t)
	logs := &logBuffer{}
	hc := handoff.DefaultConfig()
	hc.CutoverWaitTimeout = time.Nanosecond // the fallback fires as soon as the target is ready
	closed := make(chan relocation.ClosingReason, 4)
	kind := relocation.Kind{StableType: "closing-counter", Producer: func() actor.Actor { return &closingCounter{closed: closed} },
		Policy: relocation.PreserveStateWith(closingState{})}
	a := startNodeWith(t, store, kind)
	b := startNodeConfig(t, store, relocation.Config{Handoff: hc, Logger: logs.logger()}, kind)
	ready := holdAtRelayReady(t, a)
	ctx := context.Background()
	key := location.Key(location.KindActor, "late")
	pid, err := a.driver.Spawn(ctx, "closing-counter", key.ID)
	require.NoError(t, err)
	moved := make(chan error, 1)
	go func() {
		_, err := a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
		moved <- err
	}()
	ready.wait(t)
	testwait.For(t, func() bool {
		v, err := store.Read(ctx, key)
		return err == nil && v.Record.GetOwner().GetNodeRid() == b.node.Descriptor().GetNodeRid()
	}, "the target never committed by its fallback")
	require.True(t, logs.has("cutover_timeout"))
	const sends = 50
	root := a.node.System().Root
	for i := int64(1); i <= sends; i++ {
		root.Send(pid, wrapperspb.Int64(i)) // sealed: the boundary batch
	}
	records := holdAt(t, b, func(m any) bool { _, ok := m.(*messages.RelayedRecord); return ok })
	ready.release()
	require.NoError(t, <-moved)
	records.wait(t)
	select {
	case r := <-closed: // the source saw the commit and dropped the instance
		require.Equal(t, relocation.RelocationOut, r)
	case <-time.After(testwait.Patience(t)):
		t.Fatal("the source never closed the instance that moved")
	}

	answered := make(chan int64, 1)
	go func() {
		res, err := root.RequestFuture(pid, wrapperspb.String("get"), testwait.Patience(t)).Result()
		if err != nil || relocation.DeliveryError(res) != nil {
			answered <- -1
			return
		}
		answered <- res.(*wrapperspb.Int64Value).Value
	}()
	// Either the request followed at once (answered while the records
	// wait at the target), or it is held at the source.
	var got int64
	done := false
	testwait.For(t, func() bool {
		select {
		case got = <-answered:
			done = true
			return true
		default:
		}
		return relocation.HeldAfterCutover(a.driver, key) == 1
	}, "the request neither followed nor waited at the source")
	records.release()
	if !done {
		got = <-answered
	}
	require.EqualValues(t, sends, got, "the request was handled before the sends relayed ahead of it")
}

// perSender records, per sender, the sequence numbers of its numbered sends
// (Int64Value sender<<32 | seq) in the order it handled them, so that a
// test sees a loss or a duplicate even where the order may change.
type perSender struct {
	Seqs map[uint32][]uint32 `json:"seqs"`
}

func (y *perSender) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *wrapperspb.Int64Value:
		if y.Seqs == nil {
			y.Seqs = map[uint32][]uint32{}
		}
		sender := uint32(uint64(m.Value) >> 32)
		y.Seqs[sender] = append(y.Seqs[sender], uint32(m.Value))
	case *wrapperspb.StringValue: // "stats"
		b, _ := json.Marshal(y)
		c.Respond(wrapperspb.Bytes(b))
	}
}

func (y *perSender) total() int {
	n := 0
	for _, s := range y.Seqs {
		n += len(s)
	}
	return n
}

type perSenderState struct{}

func (perSenderState) Capture(a actor.Actor) ([]byte, error) { return json.Marshal(a.(*perSender)) }
func (perSenderState) Restore(a actor.Actor, b []byte) error {
	return json.Unmarshal(b, a.(*perSender))
}

var perSenderKind = relocation.Kind{StableType: "per-sender", Producer: func() actor.Actor { return &perSender{} }, Policy: relocation.PreserveStateWith(perSenderState{})}

// perSenderStats asks the perSender behind key, through its owner b.
func perSenderStats(t *testing.T, b *testNode, key location.AuthorityKey) perSender {
	t.Helper()
	direct, err := b.driver.Resolve(context.Background(), key)
	require.NoError(t, err)
	res, err := b.node.System().Root.RequestFuture(direct, wrapperspb.String("stats"), 10*time.Second).Result()
	require.NoError(t, err)
	var y perSender
	require.NoError(t, json.Unmarshal(res.(*wrapperspb.BytesValue).Value, &y))
	return y
}

// A send on a route through a node that has since stopped is not lost:
// the transport dead-letters it on the sender's node, whose driver
// re-resolves the object from the store and delivers it to the live owner.
// The same for a send to an incarnation that no longer exists on a live
// node (its follow period over). Each send is handled once.
func TestSendsThroughAGoneNodeOrIncarnationAreRedelivered(t *testing.T) {
	store := newStore(t)
	cfg := shortFollow(testLogger())
	a := startNodeConfig(t, store, cfg, counterKind)
	b := startNodeConfig(t, store, cfg, counterKind)
	c := startNodeConfig(t, store, cfg, counterKind)
	ctx := context.Background()
	key := location.Key(location.KindActor, "gone")
	old, err := a.driver.Spawn(ctx, "counter", key.ID)
	require.NoError(t, err)
	_, err = a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
	require.NoError(t, err)
	now, err := c.driver.Resolve(ctx, key)
	require.NoError(t, err)
	require.NoError(t, a.node.Stop(ctx))

	// c holds the old route, through a, which has left.
	for i := int64(1); i <= 20; i++ {
		c.node.System().Root.Send(old, wrapperspb.Int64(i))
	}
	waitCount(t, c.node.System(), now, 20)

	// The incarnation on b moves to c, and its follow period on b ends:
	// the route to b's incarnation names an actor that no longer exists.
	_, err = b.driver.Relocate(ctx, key, c.node.Descriptor().GetNodeRid())
	require.NoError(t, err)
	onB := now
	now, err = c.driver.Resolve(ctx, key)
	require.NoError(t, err)
	waitDeadLetter(t, b.node.System(), onB)
	for i := int64(21); i <= 30; i++ {
		b.node.System().Root.Send(onB, wrapperspb.Int64(i))
	}
	waitCount(t, c.node.System(), now, 30)
}

// Message Follow does not send into a connection that ended: the old
// incarnation on a follows to b, b moved the object on to c and stopped.
// A request to a's old route would otherwise go to b's dead address,
// where Proto.Actor redials for seconds and then drops it; a's driver
// knows that connection ended and delivers from the store's owner record
// instead, in order: the request is answered by c's incarnation, with
// every earlier send handled once.
func TestFollowToANodeWhoseConnectionEndedIsDeliveredFromTheStore(t *testing.T) {
	store := newStore(t)
	a := startNodeWith(t, store, counterKind)
	b := startNodeWith(t, store, counterKind)
	c := startNodeWith(t, store, counterKind)
	ctx := context.Background()
	key := location.Key(location.KindActor, "via-gone")
	old, err := a.driver.Spawn(ctx, "counter", key.ID)
	require.NoError(t, err)
	sys := a.node.System()
	for i := int64(1); i <= 5; i++ {
		sys.Root.Send(old, wrapperspb.Int64(i))
	}
	_, err = a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
	require.NoError(t, err)
	require.Equal(t, int64(5), get(t, sys, old), "a follows to b")
	_, err = b.driver.Relocate(ctx, key, c.node.Descriptor().GetNodeRid())
	require.NoError(t, err)
	gone := b.node.Address()
	require.NoError(t, b.node.Stop(ctx))
	require.Eventually(t, func() bool { return a.driver.ConnectionEnded(gone) }, testwait.Patience(t), 10*time.Millisecond,
		"a sees its connection to b end")
	for i := int64(6); i <= 10; i++ {
		sys.Root.Send(old, wrapperspb.Int64(i))
	}
	require.Equal(t, int64(10), get(t, sys, old), "answered by c's incarnation, every send once and in order")
}

// waitCount waits until the counter at pid reports n (a negative count
// means disorder, which fails at once).
func waitCount(t *testing.T, sys *actor.ActorSystem, pid *actor.PID, n int64) {
	t.Helper()
	deadline := time.Now().Add(testwait.Patience(t))
	for {
		got := get(t, sys, pid)
		require.GreaterOrEqual(t, got, int64(0), "handled out of order")
		require.LessOrEqual(t, got, n, "handled more than once")
		if got == n {
			return
		}
		require.True(t, time.Now().Before(deadline), "only %d of %d sends arrived", got, n)
		time.Sleep(20 * time.Millisecond)
	}
}

// waitDeadLetter waits until a request to pid is answered as a dead
// letter: the incarnation no longer exists.
func waitDeadLetter(t *testing.T, sys *actor.ActorSystem, pid *actor.PID) {
	t.Helper()
	deadline := time.Now().Add(testwait.Patience(t))
	for {
		_, err := sys.Root.RequestFuture(pid, wrapperspb.String("get"), 5*time.Second).Result()
		if errors.Is(err, actor.ErrDeadLetter) {
			return
		}
		require.True(t, time.Now().Before(deadline), "the incarnation at %s never went away", pid)
		time.Sleep(50 * time.Millisecond)
	}
}

// A cold activation's envelope (SpotActivation) that Proto.Actor dead-letters —
// its target node is gone — never reached a Spot service, so its first
// message did not run: a request is answered Unavailable at once, a
// one-way send is logged (send_dead_letter) and counted; neither vanishes
// with only Proto.Actor's dead-letter log line.
// Reference: PROTOCOL.md §7.5 (SpotActivation), docs/FAULTS.md ("Sends that
// dead-letter").
func TestADeadLetteredActivationFailsLoudly(t *testing.T) {
	store := newStore(t)
	logs := &logBuffer{}
	a := startNodeConfig(t, store, relocation.Config{Logger: logs.logger()})
	sys := a.node.System()
	gone := actor.NewPID("127.0.0.1:1", "roam/spot")
	f := actor.NewFuture(sys, testwait.Patience(t))
	request := &messages.SpotActivation{SpotId: "s1", OperationId: "op1", RouteKind: 2,
		First: &messages.Envelope{Sender: &messages.PID{Address: f.PID().Address, Id: f.PID().Id}}}
	sys.EventStream.Publish(&actor.DeadLetterEvent{PID: gone, Message: request})
	res, err := f.Result()
	require.NoError(t, err)
	require.ErrorIs(t, relocation.DeliveryError(res), roamerr.ErrUnavailable)

	send := &messages.SpotActivation{SpotId: "s2", OperationId: "op2", RouteKind: 2, First: &messages.Envelope{}}
	sys.EventStream.Publish(&actor.DeadLetterEvent{PID: gone, Message: send})
	testwait.For(t, func() bool { return logs.hasLine("send_dead_letter", "s2") }, "the dead-lettered send was not reported")
}

// shortFollow is a node configuration with a 200 ms Message Follow period:
// a moved-away incarnation is gone soon, and sends to it dead-letter.
func shortFollow(logger *zerolog.Logger) relocation.Config {
	cfg := relocation.Config{Logger: logger, Handoff: handoff.DefaultConfig()}
	cfg.Handoff.FollowDuration = 200 * time.Millisecond
	return cfg
}

// A moved object's source keeps timers for Message Follow long after the
// move; once its node stops they all stop, so a stopped node's driver
// is not kept in memory until the last would have fired.
func TestAStoppedNodeStopsItsMoveTimers(t *testing.T) {
	c := startNodes(t, 2)
	ctx := context.Background()
	a := c.nodes[0]
	_, err := a.driver.Spawn(ctx, "counter", "timers")
	require.NoError(t, err)
	_, err = a.driver.Relocate(ctx, location.Key(location.KindActor, "timers"), c.rid(1))
	require.NoError(t, err)
	require.Positive(t, relocation.RunningTimers(a.driver), "the source follows the moved object for a while")
	require.NoError(t, a.node.Stop(ctx))
	testwait.For(t, func() bool { return relocation.RunningTimers(a.driver) == 0 }, "timers still run on a stopped node")
}

// A rolling restart on fixed ports: b drained, said it is leaving, stopped,
// and started again under the same address as a new lifecycle. a's Message
// Follow to the new b goes straight there (b's Leaving named the old
// lifecycle), and whichever way a followed message goes, its sender's node
// is told (OnFollow), so that a route cached to a's old incarnation is
// dropped and a's follow falls quiet. Before, every message to the old
// route went by the store for a minute, no sender was told, and a drained
// a waited for a quiet follow until its stop's deadline ran out.
// Reference: docs/FAULTS.md, "Routes to a node that has left".
func TestFollowToANodeRestartedUnderTheSameAddress(t *testing.T) {
	store := newStore(t)
	logs := &logBuffer{}
	var followed atomic.Int64
	cfg := relocation.Config{Logger: logs.logger(), OnFollow: func(location.AuthorityKey, *actor.MessageEnvelope) { followed.Add(1) }}
	a := startNodeConfig(t, store, cfg, counterKind)
	b := startNodeWith(t, store, counterKind)
	ctx := context.Background()
	addr := b.node.Address()
	oldRid := b.node.Descriptor().GetNodeRid()
	require.NoError(t, b.driver.Leaving(ctx, a.node.Address()))
	require.True(t, a.driver.PeerLeaving(addr, oldRid))
	require.NoError(t, b.node.Stop(ctx))
	testwait.For(t, func() bool { return a.driver.ConnectionEnded(addr) }, "a never saw its connection to the old b end")

	host, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	b2 := startMeshNode(t, meshnode.Config{Store: store, Logger: testLogger(), Host: host, Port: p}, relocation.Config{Logger: testLogger()}, counterKind)
	require.Equal(t, addr, b2.node.Address())
	newRid := b2.node.Descriptor().GetNodeRid()
	require.False(t, a.driver.PeerLeaving(addr, newRid), "the new lifecycle under the address is not leaving")

	key := location.Key(location.KindActor, "restarted-target")
	old, err := a.driver.Spawn(ctx, "counter", key.ID)
	require.NoError(t, err)
	sys := a.node.System()
	for i := int64(1); i <= 5; i++ {
		sys.Root.Send(old, wrapperspb.Int64(i))
	}
	_, err = a.driver.Relocate(ctx, key, newRid)
	require.NoError(t, err)
	for i := int64(6); i <= 10; i++ {
		sys.Root.Send(old, wrapperspb.Int64(i))
	}
	require.Equal(t, int64(10), get(t, sys, old), "answered by the new b's incarnation, every send once and in order")
	require.False(t, logs.has("follow_reresolved"), "followed through the store, not straight to the new lifecycle")
	require.GreaterOrEqual(t, followed.Load(), int64(6), "every followed message tells its sender's node")
}

// A next hop that is gone is followed through the store, and its sender's
// node is told all the same (OnFollow): else a route cached to the old
// incarnation keeps every later message coming through it.
func TestFollowThroughTheStoreTellsTheSender(t *testing.T) {
	store := newStore(t)
	var followed atomic.Int64
	cfg := relocation.Config{Logger: testLogger(), OnFollow: func(location.AuthorityKey, *actor.MessageEnvelope) { followed.Add(1) }}
	a := startNodeConfig(t, store, cfg, counterKind)
	b := startNodeWith(t, store, counterKind)
	c := startNodeWith(t, store, counterKind)
	ctx := context.Background()
	old := spawnMovedTwice(t, "via-store-hint", a, b, c)
	gone := b.node.Address()
	require.NoError(t, b.node.Stop(ctx))
	testwait.For(t, func() bool { return a.driver.ConnectionEnded(gone) }, "a never saw its connection to b end")
	before := followed.Load()
	sys := a.node.System()
	for i := int64(1); i <= 5; i++ {
		sys.Root.Send(old, wrapperspb.Int64(i))
	}
	require.Equal(t, int64(5), get(t, sys, old), "answered by c's incarnation")
	require.GreaterOrEqual(t, followed.Load()-before, int64(6), "each message followed through the store told its sender's node")
}

// A Message Follow hop that says it is leaving while still connected is
// drained before the store's owner gets anything: the messages this
// incarnation forwarded to it are still on their way through it, and the
// first message sent by the store's record would overtake them. Every
// send is handled once and in order (the counter counts disorder).
// Reference: docs/PROTOCOL.md §7.8, docs/FAULTS.md "Routes to a node that
// has left".
func TestFollowDrainsALeavingHopBeforeTheStore(t *testing.T) {
	store := newStore(t)
	a := startNodeWith(t, store, counterKind)
	b := startNodeWith(t, store, counterKind)
	c := startNodeWith(t, store, counterKind)
	ctx := context.Background()
	old := spawnMovedTwice(t, "leaving-hop", a, b, c)
	sys := a.node.System()
	const n = 3000
	left := make(chan error, 1)
	for i := int64(1); i <= n; i++ {
		if i == n/3 {
			go func() { left <- b.driver.Leaving(ctx, a.node.Address()) }()
		}
		sys.Root.Send(old, wrapperspb.Int64(i))
	}
	require.NoError(t, <-left)
	require.True(t, a.driver.PeerLeaving(b.node.Address(), b.node.Descriptor().GetNodeRid()))
	require.Equal(t, int64(n), get(t, sys, old), "every send handled once and in order (negative: out of order)")
}

// spawnMovedTwice spawns the counter Actor id on a and moves it to b, then
// to c: a's incarnation follows to b's, b's to c's. It returns a's PID.
func spawnMovedTwice(t *testing.T, id string, a, b, c *testNode) *actor.PID {
	t.Helper()
	ctx := context.Background()
	key := location.Key(location.KindActor, id)
	old, err := a.driver.Spawn(ctx, "counter", key.ID)
	require.NoError(t, err)
	_, err = a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
	require.NoError(t, err)
	_, err = b.driver.Relocate(ctx, key, c.node.Descriptor().GetNodeRid())
	require.NoError(t, err)
	return old
}
