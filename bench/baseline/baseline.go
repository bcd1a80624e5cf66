// Package baseline measures how a plain Proto.Actor application moves a
// stateful actor from one node to another without roam, so that roam's
// relocation numbers can be compared against it in the same run
// (bench/RESULTS.md; docs/PROTOCOL.md §4.1 says what both rely on from
// Proto.Actor's remote).
//
// The Proto.Actor way is kill and reactivate: the actor is stopped on its
// old node (PoisonFuture: it first handles what is already in its mailbox),
// its state is persisted to a store (Consul KV), the new owner's address is
// written to the store, and the actor is spawned under the same name on the
// new node, where it loads its state before its first message. Callers
// resolve the owner from the store and keep using the PID they resolved;
// Proto.Actor's remote drops one-way messages to a dead PID silently, and a
// request to a dead PID fails with actor.ErrDeadLetter, or by its timeout
// when it reached the mailbox after the poison pill (the stopped actor's
// mailbox drops it without a DeadLetterResponse); either way the caller
// re-resolves the owner and retries. Lost one-way messages stay lost: that
// is what this package counts.
//
// Three actor systems with remote run in the calling process on free
// 127.0.0.1 ports: nodes A and B, which host the actor in turn, and a
// client node for the sender, so that every message crosses the network
// both before and after a move (a sender on A or B would reach the actor
// locally on one side of every move).
package baseline

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/hashicorp/consul/api"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Result is one move the Proto.Actor way.
//
// A trial's window starts when the mover begins the run period that precedes
// the move (the actor runs for Config.RunBetween on its old node while the
// sender is busy) and ends when the reactivated actor has handled its first
// message on the new node. Windows are contiguous: trial i+1 starts where
// trial i ends. Sends, requests and retries are attributed to the window in
// which their sequence number was issued; Lost is computed after the sender
// has stopped and in-flight messages have drained (a final request round
// trip to both nodes), so a send counts as lost only if it was never handled
// anywhere.
type Result struct {
	Pause      time.Duration // last message handled on A -> first message handled on B
	Sent       int           // one-way sends issued during the trial
	Lost       int           // one-way sends never handled (neither on A nor on B)
	Requests   int           // requests issued during the trial
	Retried    int           // requests that failed (dead letter / timeout) and were retried against the re-resolved owner
	StateBytes int
	// Move is the mover's own part of the pause: poison pill sent on A ->
	// actor started on B with its state loaded (stop, persist, owner write,
	// spawn, load). Pause minus Move is how long callers took to find B.
	Move time.Duration
}

// Defaults of Config.
const (
	DefaultRunBetween     = 50 * time.Millisecond
	DefaultRequestTimeout = 200 * time.Millisecond
	DefaultRequestEvery   = 10
	// MaxValueBytes is Consul's largest KV value (raft's suggested maximum
	// data size, Consul's default kv_max_value_size): larger state is split
	// into parts of this size.
	MaxValueBytes = 512 << 10
	// ActorName is the name the counter actor has on every node.
	ActorName = "baseline-counter"
)

// Config configures Run. Zero fields take the documented defaults.
type Config struct {
	// ConsulAddr is the HTTP address of Consul, host:port. Required.
	ConsulAddr string
	// StateBytes is the size of the actor's state (at least 8: the counter).
	StateBytes int
	// Trials is the number of moves; they alternate A→B, B→A, ...
	Trials int
	// RunBetween is how long the actor runs on a node before it is moved.
	// Default 50 ms.
	RunBetween time.Duration
	// RequestTimeout of every request the sender makes. Default 200 ms. A
	// request that reaches the mailbox after the poison pill is dropped
	// silently when the actor stops and only this timeout tells the sender,
	// so such a move pauses for about this long.
	RequestTimeout time.Duration
	// RequestEvery makes every n-th message a request. Default 10.
	RequestEvery int
	// KeyPrefix is the Consul KV prefix, deleted at the end. Default
	// "roam-bench-baseline/<unixnano>".
	KeyPrefix string
	// PersistInStopping makes the actor write its state to Consul itself,
	// in its Stopping handler. By default it hands its state to the mover
	// in memory while it stops, and the mover writes it once the actor is
	// gone (stop, then persist). Persisting in Stopping is a common pattern
	// but costs callers dearly: while the write runs the actor is still
	// registered, so messages that arrive then are queued and dropped
	// silently when it stops (no DeadLetterResponse), and a request queued
	// there fails only by its timeout; in practice every move then pauses
	// for about RequestTimeout.
	PersistInStopping bool
}

// Report is what Run measured.
type Report struct {
	Results []Result
	// Handled is the number of user messages (one-way and requests) the
	// actor handled over all its activations, as observed by the probe.
	Handled uint64
	// FinalCounter is the counter in the actor's state after the last move,
	// read with the final request. It equals Handled iff the state survived
	// every move.
	FinalCounter uint64
}

// KillAndReactivate moves one counter actor with stateBytes of state from
// node A to node B `trials` times, the way a Proto.Actor application does it
// without roam: stop the actor on A (PoisonFuture), persist its state to
// Consul KV (a single key; state over 512 KiB is split into parts), write its
// new owner address under another Consul key, spawn it on B and load the
// state from Consul. While this happens, a sender goroutine keeps (a) sending
// numbered one-way messages to the address it last resolved and (b) every
// 10th message making a request; on a dead letter or timeout the sender
// re-resolves the owner from Consul and retries the request, but lost one-way
// sends are lost (Proto.Actor's behaviour: they are counted). See Result for
// what a trial covers. It fails if the actor's state did not survive.
func KillAndReactivate(ctx context.Context, consulAddr string, stateBytes, trials int) ([]Result, error) {
	rep, err := Run(ctx, Config{ConsulAddr: consulAddr, StateBytes: stateBytes, Trials: trials})
	if err != nil {
		return nil, err
	}
	if rep.FinalCounter != rep.Handled {
		return rep.Results, fmt.Errorf("baseline: state lost: counter %d after the moves, %d messages handled", rep.FinalCounter, rep.Handled)
	}
	return rep.Results, nil
}

// Run is KillAndReactivate with every knob.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.ConsulAddr == "" {
		return nil, errors.New("baseline: Config.ConsulAddr is required")
	}
	if cfg.StateBytes < 8 {
		cfg.StateBytes = 8
	}
	if cfg.Trials < 0 {
		return nil, fmt.Errorf("baseline: %d trials", cfg.Trials)
	}
	if cfg.RunBetween <= 0 {
		cfg.RunBetween = DefaultRunBetween
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	if cfg.RequestEvery <= 0 {
		cfg.RequestEvery = DefaultRequestEvery
	}
	if cfg.KeyPrefix == "" {
		cfg.KeyPrefix = "roam-bench-baseline/" + strconv.FormatInt(time.Now().UnixNano(), 10)
	}

	// A transport of the run's own, whose kept connections end with it:
	// make bench checks that no section leaves any behind.
	transport := http.DefaultTransport.(*http.Transport).Clone()
	defer transport.CloseIdleConnections() // after the clean-up below
	consul, err := api.NewClient(&api.Config{Address: cfg.ConsulAddr, Transport: transport})
	if err != nil {
		return nil, fmt.Errorf("baseline: consul client: %w", err)
	}
	kv := consul.KV()
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = kv.DeleteTree(cfg.KeyPrefix+"/", (&api.WriteOptions{}).WithContext(dctx))
	}()

	var nodes [3]*node // A, B, client
	defer func() {
		// The client first: it is the one connected to both others.
		stopAll([]*node{nodes[2], nodes[0], nodes[1]})
	}()
	for i := range nodes {
		if nodes[i], err = startNode(); err != nil {
			return nil, err
		}
	}
	a, b, client := nodes[0], nodes[1], nodes[2]

	r := &run{
		ctx:        ctx,
		cfg:        cfg,
		kv:         kv,
		stateKey:   cfg.KeyPrefix + "/" + ActorName + "/state",
		ownerKey:   cfg.KeyPrefix + "/" + ActorName + "/owner",
		activated:  make(chan time.Time, 1),
		deactivate: make(chan stopped, 1),
		loaded:     make(chan time.Time, 1),
	}
	props := actor.PropsFromProducer(func() actor.Actor { return &counter{run: r} })

	// Open every connection the trials use (client ⇄ A, client ⇄ B), so
	// that no trial pays for a gRPC dial.
	for _, n := range []*node{a, b} {
		if err := warmUp(client, n); err != nil {
			return nil, err
		}
	}

	// The first activation, on A, is not a trial.
	if _, err := a.system.Root.SpawnNamed(props, ActorName); err != nil {
		return nil, fmt.Errorf("baseline: spawn on A: %w", err)
	}
	if err := r.putOwner(a.addr()); err != nil {
		return nil, err
	}
	snd := &sender{run: r, root: client.system.Root}
	senderDone := make(chan struct{})
	go func() { defer close(senderDone); snd.loop() }()
	stopSender := func() {
		snd.stop.Store(true)
		<-senderDone
	}
	fail := func(err error) (*Report, error) {
		stopSender()
		if serr := snd.failure(); serr != nil {
			err = errors.Join(err, serr)
		}
		return nil, err
	}
	if _, err := r.waitActivated(); err != nil {
		return fail(err)
	}
	select {
	case <-r.loaded:
	default:
		return fail(errors.New("baseline: actor handled a message before it started"))
	}

	type window struct {
		from, to uint64 // sequence numbers (from, to]
		pause    time.Duration
		move     time.Duration
	}
	windows := make([]window, 0, cfg.Trials)
	hosts := [2]*node{a, b}
	for i := 0; i < cfg.Trials; i++ {
		src, dst := hosts[i%2], hosts[(i+1)%2]
		from := snd.seq.Load()
		select {
		case <-ctx.Done():
			return fail(ctx.Err())
		case <-time.After(cfg.RunBetween): // let the actor serve the sender
		}
		// Stop it: it handles what is queued, then hands its state over
		// (or persists it itself, with PersistInStopping).
		poisonAt := time.Now()
		if err := src.system.Root.PoisonFuture(actor.NewPID(src.addr(), ActorName)).Wait(); err != nil {
			return fail(fmt.Errorf("baseline: trial %d: stop on %s: %w", i, src.addr(), err))
		}
		var old stopped
		select {
		case old = <-r.deactivate:
		default:
			return fail(fmt.Errorf("baseline: trial %d: actor stopped without reporting", i))
		}
		if err := r.failure(); err != nil {
			return fail(fmt.Errorf("baseline: trial %d: %w", i, err))
		}
		if !cfg.PersistInStopping {
			if err := r.persist(old.state); err != nil {
				return fail(fmt.Errorf("baseline: trial %d: persist state: %w", i, err))
			}
		}
		// Spawned before it is named the owner: Proto.Actor registers a
		// spawning actor's name before its mailbox has a dispatcher, and a
		// remote message that reaches the name in between crashes the
		// process (defaultMailbox.schedule on a nil dispatcher; seen in make
		// bench). Nothing is sent to it before the sender reads it as the
		// owner.
		if _, err := dst.system.Root.SpawnNamed(props, ActorName); err != nil {
			return fail(fmt.Errorf("baseline: trial %d: spawn on %s: %w", i, dst.addr(), err))
		}
		if err := r.putOwner(dst.addr()); err != nil {
			return fail(fmt.Errorf("baseline: trial %d: %w", i, err))
		}
		firstNew, err := r.waitActivated()
		if err != nil {
			return fail(fmt.Errorf("baseline: trial %d: %w", i, err))
		}
		var loadedAt time.Time
		select {
		case loadedAt = <-r.loaded:
		default:
			return fail(fmt.Errorf("baseline: trial %d: actor handled a message before it started", i))
		}
		if old.lastAt.IsZero() {
			return fail(fmt.Errorf("baseline: trial %d: the actor handled nothing on %s before it stopped", i, src.addr()))
		}
		windows = append(windows, window{from: from, to: snd.seq.Load(), pause: firstNew.Sub(old.lastAt), move: loadedAt.Sub(poisonAt)})
	}
	stopSender()
	if err := snd.failure(); err != nil {
		return nil, err
	}

	// Drain: remote keeps FIFO per sender → node, so once a request round
	// trip to a node has completed, every message the client sent to that
	// node before it has been handled or dropped. The dead node answers
	// with a dead letter; the owner answers with its counter.
	owner := hosts[cfg.Trials%2]
	other := hosts[(cfg.Trials+1)%2]
	if _, err := client.system.Root.RequestFuture(actor.NewPID(other.addr(), ActorName), wrapperspb.String("drain"), 10*time.Second).Result(); !errors.Is(err, actor.ErrDeadLetter) {
		return nil, fmt.Errorf("baseline: drain %s: want a dead letter, got %v", other.addr(), err)
	}
	res, err := client.system.Root.RequestFuture(actor.NewPID(owner.addr(), ActorName), wrapperspb.String("drain"), 10*time.Second).Result()
	if err != nil {
		return nil, fmt.Errorf("baseline: drain %s: %w", owner.addr(), err)
	}
	final, ok := res.(*wrapperspb.UInt64Value)
	if !ok {
		return nil, fmt.Errorf("baseline: drain: unexpected answer %T", res)
	}
	// Retire the actor, so nothing writes under the prefix once it is
	// deleted.
	if err := owner.system.Root.PoisonFuture(actor.NewPID(owner.addr(), ActorName)).Wait(); err != nil {
		return nil, fmt.Errorf("baseline: stop the actor on %s: %w", owner.addr(), err)
	}
	if err := r.failure(); err != nil {
		return nil, err
	}

	rep := &Report{FinalCounter: final.GetValue()}
	r.mu.Lock()
	defer r.mu.Unlock()
	rep.Handled = r.total
	every := uint64(cfg.RequestEvery)
	for _, w := range windows {
		res := Result{Pause: w.pause, Move: w.move, StateBytes: cfg.StateBytes}
		for s := w.from + 1; s <= w.to; s++ {
			if s%every == 0 {
				res.Requests++
				if snd.retried.has(s) {
					res.Retried++
				}
				continue
			}
			res.Sent++
			if !r.handled.has(s) {
				res.Lost++
			}
		}
		rep.Results = append(rep.Results, res)
	}
	return rep, nil
}

// run is what the actor, the sender and the mover share.
type run struct {
	ctx      context.Context
	cfg      Config
	kv       *api.KV
	stateKey string
	ownerKey string

	// activated gets the time of the first message each activation handles,
	// loaded the time each activation finished loading its state, and
	// deactivate what an activation reports while it stops.
	activated  chan time.Time
	loaded     chan time.Time
	deactivate chan stopped

	mu      sync.Mutex
	handled bitset // one-way sequence numbers handled, by any activation
	total   uint64 // user messages handled (one-way and requests)
	err     error  // first failure of the actor (load or persist)
}

func (r *run) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		r.err = err
	}
}

func (r *run) failure() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

func (r *run) waitActivated() (time.Time, error) {
	t := time.NewTimer(30 * time.Second)
	defer t.Stop()
	select {
	case at := <-r.activated:
		return at, r.failure()
	case <-r.ctx.Done():
		return time.Time{}, r.ctx.Err()
	case <-t.C:
		if err := r.failure(); err != nil {
			return time.Time{}, err
		}
		return time.Time{}, errors.New("baseline: the reactivated actor handled no message within 30 s")
	}
}

func (r *run) opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.ctx, 10*time.Second)
}

func (r *run) putOwner(addr string) error {
	ctx, cancel := r.opCtx()
	defer cancel()
	if _, err := r.kv.Put(&api.KVPair{Key: r.ownerKey, Value: []byte(addr)}, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
		return fmt.Errorf("write owner: %w", err)
	}
	return nil
}

func (r *run) resolveOwner() (string, error) {
	ctx, cancel := r.opCtx()
	defer cancel()
	p, _, err := r.kv.Get(r.ownerKey, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return "", fmt.Errorf("resolve owner: %w", err)
	}
	if p == nil {
		return "", errors.New("resolve owner: no owner key")
	}
	return string(p.Value), nil
}

func (r *run) partKey(i int) string { return r.stateKey + "-part/" + strconv.Itoa(i) }

// persist writes the state: one key when it fits in a Consul value, else
// its parts first and then the head key, whose Flags hold the part count.
func (r *run) persist(state []byte) error {
	ctx, cancel := r.opCtx()
	defer cancel()
	w := (&api.WriteOptions{}).WithContext(ctx)
	if len(state) <= MaxValueBytes {
		_, err := r.kv.Put(&api.KVPair{Key: r.stateKey, Value: state}, w)
		return err
	}
	parts := 0
	for off := 0; off < len(state); off += MaxValueBytes {
		end := min(off+MaxValueBytes, len(state))
		if _, err := r.kv.Put(&api.KVPair{Key: r.partKey(parts), Value: state[off:end]}, w); err != nil {
			return err
		}
		parts++
	}
	_, err := r.kv.Put(&api.KVPair{Key: r.stateKey, Flags: uint64(parts)}, w)
	return err
}

// load reads the state; nil if none was persisted yet.
func (r *run) load() ([]byte, error) {
	ctx, cancel := r.opCtx()
	defer cancel()
	q := (&api.QueryOptions{}).WithContext(ctx)
	head, _, err := r.kv.Get(r.stateKey, q)
	if err != nil || head == nil {
		return nil, err
	}
	if head.Flags == 0 {
		return head.Value, nil
	}
	state := make([]byte, 0, int(head.Flags)*MaxValueBytes)
	for i := 0; i < int(head.Flags); i++ {
		p, _, err := r.kv.Get(r.partKey(i), q)
		if err != nil {
			return nil, err
		}
		if p == nil {
			return nil, fmt.Errorf("state part %d missing", i)
		}
		state = append(state, p.Value...)
	}
	return state, nil
}

// stopped is what an activation reports while it stops.
type stopped struct {
	lastAt time.Time // when it handled its last message
	state  []byte    // its state, unless it persisted it itself
}

// counter is the relocated actor. Its state is a big-endian uint64 counter
// of handled messages followed by filler up to StateBytes.
type counter struct {
	run    *run
	state  []byte
	count  uint64
	lastAt time.Time
	seen   bool
}

func (c *counter) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		state, err := c.run.load()
		switch {
		case err != nil:
			c.run.fail(fmt.Errorf("load state: %w", err))
		case state == nil:
			c.state = make([]byte, c.run.cfg.StateBytes)
			for i := 8; i < len(c.state); i++ {
				c.state[i] = byte(i)
			}
		case len(state) != c.run.cfg.StateBytes:
			c.run.fail(fmt.Errorf("load state: %d bytes, want %d", len(state), c.run.cfg.StateBytes))
		default:
			c.state = state
			c.count = binary.BigEndian.Uint64(state)
		}
		if c.state == nil {
			c.state = make([]byte, c.run.cfg.StateBytes)
		}
		select { // the mover reads it after every spawn
		case c.run.loaded <- time.Now():
		default:
		}
	case *actor.Stopping:
		binary.BigEndian.PutUint64(c.state, c.count)
		out := stopped{lastAt: c.lastAt}
		if !c.run.cfg.PersistInStopping {
			out.state = c.state
		} else if err := c.run.persist(c.state); err != nil {
			c.run.fail(fmt.Errorf("persist state: %w", err))
		}
		select { // the mover reads it after every stop
		case c.run.deactivate <- out:
		default:
		}
	case *wrapperspb.UInt64Value:
		c.handle(m.GetValue())
	case *wrapperspb.StringValue:
		c.handle(0)
		ctx.Respond(wrapperspb.UInt64(c.count))
	}
}

// handle counts one user message; seq is 0 for a request.
func (c *counter) handle(seq uint64) {
	now := time.Now()
	c.count++
	c.lastAt = now
	r := c.run
	r.mu.Lock()
	r.total++
	if seq != 0 {
		r.handled.set(seq)
	}
	r.mu.Unlock()
	if !c.seen {
		c.seen = true
		select { // the mover reads it after every spawn
		case r.activated <- now:
		default:
		}
	}
}

// sender issues numbered messages to the owner it last resolved.
type sender struct {
	run  *run
	root *actor.RootContext

	seq  atomic.Uint64 // last sequence number issued
	stop atomic.Bool

	mu      sync.Mutex
	retried bitset // request sequence numbers that failed at least once
	err     error
}

func (s *sender) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *sender) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = fmt.Errorf("baseline: sender: %w", err)
	}
}

func (s *sender) loop() {
	addr, err := s.run.resolveOwner()
	if err != nil {
		s.fail(err)
		return
	}
	target := actor.NewPID(addr, ActorName)
	every := uint64(s.run.cfg.RequestEvery)
	for !s.stop.Load() && s.run.ctx.Err() == nil {
		seq := s.seq.Add(1)
		if seq%every != 0 {
			s.root.Send(target, wrapperspb.UInt64(seq))
			continue
		}
		if target, err = s.request(target, seq); err != nil {
			s.fail(err)
			return
		}
	}
}

// request makes one request; on a dead letter or timeout it re-resolves the
// owner and retries until it is answered. It returns the PID to use next.
func (s *sender) request(target *actor.PID, seq uint64) (*actor.PID, error) {
	msg := wrapperspb.String(strconv.FormatUint(seq, 10))
	deadline := time.Now().Add(30 * time.Second)
	for attempt := 0; ; attempt++ {
		_, err := s.root.RequestFuture(target, msg, s.run.cfg.RequestTimeout).Result()
		if err == nil {
			return target, nil
		}
		if !errors.Is(err, actor.ErrDeadLetter) && !errors.Is(err, actor.ErrTimeout) {
			return target, fmt.Errorf("request %d: %w", seq, err)
		}
		if attempt == 0 {
			s.mu.Lock()
			s.retried.set(seq)
			s.mu.Unlock()
		}
		if time.Now().After(deadline) || s.run.ctx.Err() != nil {
			return target, fmt.Errorf("request %d unanswered after %d attempts: %w", seq, attempt+1, err)
		}
		addr, rerr := s.run.resolveOwner()
		if rerr != nil {
			return target, rerr
		}
		if addr != target.Address {
			target = actor.NewPID(addr, ActorName)
		}
	}
}

// warmUp makes a request from client to an echo actor on n and back.
func warmUp(client, n *node) error {
	const name = "baseline-echo"
	echo := actor.PropsFromFunc(func(ctx actor.Context) {
		if m, ok := ctx.Message().(*wrapperspb.StringValue); ok {
			ctx.Respond(m)
		}
	})
	pid, err := n.system.Root.SpawnNamed(echo, name)
	if err != nil {
		return fmt.Errorf("baseline: spawn echo on %s: %w", n.addr(), err)
	}
	defer n.system.Root.Stop(pid)
	if _, err := client.system.Root.RequestFuture(actor.NewPID(n.addr(), name), wrapperspb.String("warm-up"), 10*time.Second).Result(); err != nil {
		return fmt.Errorf("baseline: warm up %s: %w", n.addr(), err)
	}
	return nil
}

// node is one actor system with remote.
type node struct {
	system *actor.ActorSystem
	remote *remote.Remote
	// lost gets the address of every endpoint the node's remote reported
	// lost: the same report's handler in the node's endpoint manager runs
	// beside this one, on the publishing goroutine, and is done long
	// before the next stop clears the manager's map.
	lost chan string
}

// peerStopPatience bounds how long stopAll waits for a node to report a
// stopped peer's endpoint lost: a node that never talked to that peer has
// nothing to report.
const peerStopPatience = time.Second

// stopAll stops the nodes one after another (nil ones skipped). A node's
// graceful stop clears its endpoint manager's connection map, and an
// endpoint-lost report its remote publishes at that moment reads the
// cleared map and panics the process, on a goroutine of Proto.Actor's
// (seen in make bench: the peer stopped just before had ended the
// connection). So before the next node stops, every node still running
// has handled the reports the last stop made, or had none to make.
func stopAll(nodes []*node) {
	for i, n := range nodes {
		if n == nil {
			continue
		}
		n.stop()
		for _, other := range nodes[i+1:] {
			if other != nil {
				other.awaitLost(n.addr(), peerStopPatience)
			}
		}
	}
}

// awaitLost waits until the node reported the endpoint of addr lost, at
// most patience.
func (n *node) awaitLost(addr string, patience time.Duration) {
	t := time.NewTimer(patience)
	defer t.Stop()
	for {
		select {
		case a := <-n.lost:
			if a == addr {
				return
			}
		case <-t.C:
			return
		}
	}
}

func startNode() (n *node, err error) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelError + 4}))
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet }))
	rem := remote.NewRemote(system, remote.Configure("127.0.0.1", 0))
	defer func() {
		if p := recover(); p != nil {
			system.Shutdown()
			n, err = nil, fmt.Errorf("baseline: start remote: %v", p)
		}
	}()
	rem.Start()
	n = &node{system: system, remote: rem, lost: make(chan string, 64)}
	system.EventStream.Subscribe(func(evt any) {
		if e, ok := evt.(*remote.EndpointTerminatedEvent); ok {
			select {
			case n.lost <- e.Address:
			default: // nobody waits for so many
			}
		}
	})
	return n, nil
}

func (n *node) addr() string { return n.system.Address() }

// stop ends the node at the end of a run, gracefully, so that its
// endpoint writers and their gRPC connections end with it. Proto.Actor's
// graceful stop can panic after it stopped them: it sends on every endpoint
// reader's channel, and a reader whose stream failed (a peer stopped
// first) closed its channel without leaving the map (seen in make test).
// The server is then stopped without the rest of the graceful stop.
func (n *node) stop() {
	func() {
		defer func() {
			if recover() != nil {
				n.remote.Shutdown(false)
			}
		}()
		n.remote.Shutdown(true)
	}()
	n.system.Shutdown()
}

// bitset is a growable set of sequence numbers.
type bitset []uint64

func (b *bitset) set(i uint64) {
	w := int(i / 64)
	if w >= len(*b) {
		n := max(w+1, 2*len(*b))
		grown := make([]uint64, n)
		copy(grown, *b)
		*b = grown
	}
	(*b)[w] |= 1 << (i % 64)
}

func (b bitset) has(i uint64) bool {
	w := int(i / 64)
	return w < len(b) && b[w]&(1<<(i%64)) != 0
}
