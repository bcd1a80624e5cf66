// Package mailbox is the relocatable actor's Proto.Actor mailbox.
//
// A relocatable actor runs with this actor.Mailbox instead of Proto.Actor's
// default (unexported) one. In Open mode it behaves like the default mailbox:
// system messages first, user messages in posting order, Throughput-bounded
// runs on the props' dispatcher, panics escalated to the supervisor. On top of
// that it has the modes the hand-off needs (docs/PROTOCOL.md §5.4–§5.12):
//
//	source: Open --Seal--> Sealed --Redirect--> Redirecting --Discard--> Closed
//	                          |  ^                    (Redirect again swaps the sink)
//	                  Unseal  +--+ (the only backward edge)
//	target: Staging --OpenWith--> Open            Staging|Sealed --Discard--> Closed
//
// The mailbox has no network code: the relocation driver supplies callbacks
// (captured, Sink, OnClosed, Do) and moves the values they receive.
//
// # Scheduling and concurrency
//
// The run loop is the default mailbox's: an idle/running CAS, one
// dispatcher.Schedule per idle→running transition, no goroutine of its own and
// no busy loop. After a run the loop stores idle and re-checks for work
// (system messages; or, when not suspended, control items or dispatchable
// user messages) and re-claims the loop if there is some. Every producer
// (post, Do, Seal, Unseal, OpenWith, Start, system message) first publishes
// its work with a sequentially consistent atomic write and then CASes
// idle→running, so either the producer's CAS or the loop's re-check sees the
// other side: no lost wake-up.
//
// Posted user messages, control items (Do and Seal), the mode and the sink
// are guarded by one mutex. Why that is correct and cheap:
//
//   - It is never held while actor code runs (turns, Do functions, captured,
//     OnClosed), so a poster never waits for a turn. The only callback run
//     under it is the Sink, by contract non-blocking and not re-entrant.
//   - On the hot path every critical section is O(1): a post is a mode check
//     plus a ring-buffer push (amortized: the ring grows by doubling and
//     never allocates per message); the run loop takes the lock only to swap
//     the whole posted ring with its own empty one and then dispatches that
//     batch without the lock, checking an atomic control-item count before
//     each message so a Seal or Do still lands right after the current turn.
//     In steady state the consumer takes the lock once per batch, not once
//     per message (Proto.Actor's default queue, goring, locks on both).
//   - The batch in hand only exists in Open mode, and the only way out of
//     Open (a seal) runs on the run goroutine and takes that batch first, so
//     every other transition sees all undispatched messages under the lock.
//   - Transitions that move many messages (Seal, Unseal, Redirect, OpenWith,
//     Discard) are O(n) but rare, and being one critical section is what
//     makes them atomic with respect to posts: a post is linearized at its
//     critical section, so it is either before the transition (and moved
//     with the queue) or after it (and handled by the new mode).
//
// # Lifecycle messages
//
// Proto.Actor (this version) delivers lifecycle messages through the system
// queue, not PostUserMessage: the spawner posts *actor.Started as a system
// message and actorContext.InvokeSystemMessage forwards it to
// InvokeUserMessage; Restarting, Stopping and Stopped are invoked directly
// while handling the Restart and Stop system messages, and Terminated while
// handling Terminated. So they reach the actor's Receive in every mode,
// Staging and Sealed included (a staged actor does see Started; restore its
// state with Do, which runs after it). The same holds for ReenterAfter
// continuations (a system message): they run actor code even while Sealed
// or Staging. ReceiveTimeout and PoisonPill, by contrast, are ordinary user
// messages and are held, saved, redirected or discarded like any other.
package mailbox

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
)

// Mode is the mailbox's relocation mode.
type Mode int32

const (
	// Open dispatches user messages in posting order (like the default mailbox).
	Open Mode = iota
	// Sealed: the current turn has finished; user messages are held (ingress
	// hold); nothing is dispatched.
	Sealed
	// Redirecting: every held and every new user message is handed to a Sink,
	// in order; nothing is dispatched.
	Redirecting
	// Staging (target side): user messages go to a temporary queue; nothing is
	// dispatched.
	Staging
	// Closed, after Discard: posts are handed to the closed handler; nothing
	// is dispatched.
	Closed
)

// String returns the mode's name.
func (m Mode) String() string {
	switch m {
	case Open:
		return "Open"
	case Sealed:
		return "Sealed"
	case Redirecting:
		return "Redirecting"
	case Staging:
		return "Staging"
	case Closed:
		return "Closed"
	default:
		return fmt.Sprintf("Mode(%d)", int32(m))
	}
}

// ErrMode is returned (wrapped with the operation and the current mode) by an
// operation that is not allowed in the mailbox's current mode. Such a call
// changes nothing.
var ErrMode = errors.New("relocation/mailbox: operation not allowed in this mode")

// errNilCallback is returned for a nil callback argument; it changes nothing.
var errNilCallback = errors.New("relocation/mailbox: nil callback")

func modeError(op string, mode Mode, sealPending bool) error {
	if sealPending {
		return fmt.Errorf("%w: %s in mode %s (a seal is pending)", ErrMode, op, mode)
	}
	return fmt.Errorf("%w: %s in mode %s", ErrMode, op, mode)
}

// Sink receives user messages in posting order. It is called with the
// mailbox's internal lock held, so calls are serialized and ordered with
// Redirect swaps; it must not block and must not call back into the mailbox.
type Sink func(msg any)

// Option configures a Mailbox at creation.
type Option func(*Mailbox)

// StartStaging creates the mailbox in Staging mode (a relocation target).
func StartStaging() Option {
	return func(m *Mailbox) { m.mode.Store(int32(Staging)) }
}

// Hooks connect a mailbox to the incarnation it serves. One value (the
// incarnation itself) instead of a closure per hook: an idle object's heap
// keeps no closures (docs/ARCHITECTURE.md, "An idle object's memory").
type Hooks interface {
	// GateOpen is checked by the run loop before every user message it
	// dispatches: while it returns false, user messages (timer ticks
	// included) stay queued in order and nothing of the application runs;
	// system messages and control items still do. The node's owner-lease
	// fence uses it, so no message is dispatched after the instant the
	// lease stops being provably in force, whatever the goroutine that
	// decides the fence is doing. When the gate opens again, call Wake. It
	// must be cheap and must not block.
	GateOpen() bool
	// Intercept gets every user message before the actor, in its turn; a
	// message it reports as taken never reaches the actor (nor any
	// receiver middleware of the application's). It runs on the mailbox's
	// goroutine and must not panic.
	Intercept(msg any) bool
	// Closed gets the user messages posted in Closed mode, on the posting
	// goroutine and without the mailbox lock, so it may send to other
	// actors (calls from concurrent posters may run concurrently).
	Closed(msg any)
	// StopAllowed says whether an actor.Stop (a system message) or an
	// actor.PoisonPill (a user message) may pass to the actor now; a
	// refused one goes to StopRefused and is dropped. roam ends its
	// incarnations itself: a stop from anywhere else — the application, a
	// remote peer — would leave the store naming a node that no longer
	// serves the object.
	StopAllowed() bool
	StopRefused(msg any)
	// Refuse gets every user message as it is posted, in every mode, on
	// the posting goroutine and without the mailbox lock; one it reports
	// as refused (it answered it) is neither queued nor handed on. It
	// must be cheap.
	Refuse(msg any) bool
}

// Restarter is Hooks that are told of a restart of the actor: Restart
// runs on the mailbox's goroutine right before the actor's context gets
// its Restart system message (and so before Proto.Actor makes the new
// instance of the actor), whatever the application's middleware does with
// the Restarting message that follows.
type Restarter interface{ Restart() }

// WithHooks connects the mailbox to h from its creation (before its PID is
// reachable, so posters read hooks that never change).
func WithHooks(h Hooks) Option {
	return func(m *Mailbox) { m.hooks = h }
}

// funcHooks adapts the function options (OnClosed, Gate, Intercept) to
// Hooks; a hook not set does what a mailbox without hooks does.
type funcHooks struct {
	gate      func() bool
	intercept func(msg any) bool
	closed    func(msg any)
	m         *Mailbox // its Dropped count, for Closed without a handler
	// beforeIdle, if set (by tests, before Start), runs on the run
	// goroutine after a run and before the mailbox is marked idle — the
	// window in which a producer's wake-up CAS fails — so tests can hit it
	// deterministically.
	beforeIdle func()
}

func (f *funcHooks) GateOpen() bool         { return f.gate == nil || f.gate() }
func (f *funcHooks) Intercept(msg any) bool { return f.intercept != nil && f.intercept(msg) }
func (f *funcHooks) Closed(msg any) {
	if f.closed == nil {
		f.m.countDropped()
		return
	}
	f.closed(msg)
}
func (f *funcHooks) StopAllowed() bool   { return true }
func (f *funcHooks) StopRefused(msg any) {}
func (f *funcHooks) Refuse(msg any) bool { return false }
func (m *Mailbox) funcHooks() *funcHooks {
	if f, ok := m.hooks.(*funcHooks); ok {
		return f
	}
	f := &funcHooks{m: m}
	m.hooks = f
	return f
}

// OnClosed sets where user messages posted in Closed mode go (Hooks.Closed).
// Without a handler such messages are dropped and counted (see Dropped).
func OnClosed(h func(msg any)) Option {
	return func(m *Mailbox) { m.funcHooks().closed = h }
}

// Gate sets the check of Hooks.GateOpen.
func Gate(g func() bool) Option {
	return func(m *Mailbox) { m.funcHooks().gate = g }
}

// Wake schedules the run loop, for user messages held by a gate that has
// opened again.
func (m *Mailbox) Wake() { m.schedule() }

func (m *Mailbox) gateOpen() bool { return m.hooks == nil || m.hooks.GateOpen() }

// Intercept sets Hooks.Intercept.
func Intercept(f func(msg any) bool) Option {
	return func(m *Mailbox) { m.funcHooks().intercept = f }
}

const (
	idle int32 = iota
	running
)

// ctlEndSeal is the bit of ctlCount set while a SealFinal is queued (a
// mailbox takes one seal at a time); the bits below it count the items.
const ctlEndSeal = 1 << 30

// ctlItem is a control item run on the run goroutine between turns: a Do
// function or a pending Seal's capture.
type ctlItem struct {
	do   func()
	seal func(saved []any)
	end  bool // a SealFinal: runs even while the actor is suspended
}

// Mailbox is a relocatable actor.Mailbox. Create it with New or Producer.
//
// Every idle object has one, so it is kept to 160 bytes (a size class of
// Go's allocator): what only a system message, a move, a Do or a closed
// incarnation needs is in rare.
type Mailbox struct {
	// Set by New (options) and RegisterHandlers before Start; read-only after.
	invoker    actor.MessageInvoker
	dispatcher actor.Dispatcher
	hooks      Hooks  // nil: no gate, no interception, Closed drops, stops pass
	runFn      func() // m.processMessages, bound once so scheduling does not allocate

	// status is idle or running; New makes it running, so that nothing is
	// scheduled before Start, which makes it idle and schedules.
	status    atomic.Int32
	suspended atomic.Bool // SuspendMailbox seen and no ResumeMailbox since
	// sysCount counts the system messages queued (in rare.sys, under mu).
	sysCount atomic.Int32

	// Written only under mu. Atomics so that Mode, UserMessageCount and the
	// run loop's idle re-check can read them without the lock.
	mode      atomic.Int32
	userCount atomic.Int32
	// ctlCount counts the control items queued, with ctlEndSeal set while
	// one is a SealFinal (it runs while suspended).
	ctlCount atomic.Int32

	mu   sync.Mutex
	user ring // posted user messages: dispatch queue, ingress hold or temporary queue
	// rare is made under mu when needed and dropped once it holds nothing
	// again (releaseRareLocked); nil reads as its zero value.
	rare *mailboxRare

	// out is the run goroutine's batch: in Open mode the loop swaps the
	// whole of user into it (O(1), under mu) and dispatches from it without
	// the lock. It is touched only by the run goroutine, and is non-empty
	// only in Open mode — the one transition out of Open (a seal) happens on
	// the run goroutine and takes out first — so every other operation can
	// ignore it. Its messages precede everything in user.
	out ring
}

// mailboxRare is what a mailbox needs only while a system message, a move
// or a Do is under way, or once it is closed.
type mailboxRare struct {
	// sys: system messages, in posting order (mu). They are few (Started,
	// a restart, a stop), so a lock-free queue's node kept by every idle
	// mailbox cost more than the lock.
	sys         []any
	ctl         []ctlItem // FIFO of Do items and at most one pending seal (mu)
	sealPending bool      // (mu)
	sink        Sink      // Redirecting's (mu)
	dropped     atomic.Uint64
}

// rareLocked returns m.rare, made if need be; mu is held.
func (m *Mailbox) rareLocked() *mailboxRare {
	if m.rare == nil {
		m.rare = &mailboxRare{}
	}
	return m.rare
}

// releaseRareLocked drops rare once it holds nothing: an object
// checkpointed now and then (a Do each time) keeps no rare part between.
func (m *Mailbox) releaseRareLocked() {
	if r := m.rare; r != nil && len(r.sys) == 0 && len(r.ctl) == 0 && !r.sealPending && r.sink == nil && r.dropped.Load() == 0 {
		m.rare = nil
	}
}

// sealPendingLocked reports whether a seal is queued; mu is held.
func (m *Mailbox) sealPendingLocked() bool { return m.rare != nil && m.rare.sealPending }

// endSealQueued reports whether a SealFinal is queued.
func (m *Mailbox) endSealQueued() bool { return m.ctlCount.Load()&ctlEndSeal != 0 }

// ctlItems is how many control items are queued.
func (m *Mailbox) ctlItems() int32 { return m.ctlCount.Load() &^ ctlEndSeal }

// countDropped counts a user message posted in Closed mode without a
// handler. Closed is reached under mu (Discard), which made rare.
func (m *Mailbox) countDropped() {
	// Under mu: a Do accepted before the Discard may still end and drop an
	// empty rare part, which must not take this count with it.
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rareLocked().dropped.Add(1)
}

var _ actor.Mailbox = (*Mailbox)(nil)

// New returns a mailbox in Open mode (Staging with StartStaging). It does not
// dispatch anything until RegisterHandlers and Start have been called (the
// Proto.Actor spawner does both); work submitted before is kept.
func New(opts ...Option) *Mailbox {
	m := &Mailbox{}
	m.status.Store(running) // until Start
	m.runFn = m.processMessages
	for _, o := range opts {
		if o != nil {
			o(m)
		}
	}
	return m
}

// Producer returns an actor.MailboxProducer; each mailbox it creates is also
// passed to created (so the caller gets hold of the mailbox of the actor
// being spawned). created runs synchronously inside the spawn, before the
// actor is started; it may be nil.
func Producer(created func(*Mailbox), opts ...Option) actor.MailboxProducer {
	return func() actor.Mailbox {
		m := New(opts...)
		if created != nil {
			created(m)
		}
		return m
	}
}

// PostUserMessage enqueues, holds, redirects or hands over a user message
// according to the mode. A MessageBatch (raw or as an envelope's message) is
// expanded exactly as Proto.Actor's default mailbox does: each element is
// posted first, then the batch value itself.
func (m *Mailbox) PostUserMessage(message any) {
	if batch, ok := message.(actor.MessageBatch); ok {
		for _, msg := range batch.GetMessages() {
			m.PostUserMessage(msg)
		}
	}
	if env, ok := message.(*actor.MessageEnvelope); ok {
		if batch, ok := env.Message.(actor.MessageBatch); ok {
			for _, msg := range batch.GetMessages() {
				m.PostUserMessage(msg)
			}
		}
	}
	m.post(message)
}

func (m *Mailbox) post(msg any) {
	if m.hooks != nil {
		if _, pill := actor.UnwrapEnvelopeMessage(msg).(*actor.PoisonPill); pill && !m.hooks.StopAllowed() {
			m.hooks.StopRefused(msg)
			return
		}
		if m.hooks.Refuse(msg) {
			return
		}
	}
	m.mu.Lock()
	switch Mode(m.mode.Load()) {
	case Open:
		m.user.pushBack(msg)
		m.userCount.Add(1)
		m.mu.Unlock()
		m.schedule()
	case Sealed, Staging:
		// Held: nothing to dispatch, so no wake-up. Unseal and OpenWith
		// schedule after they make these messages dispatchable.
		m.user.pushBack(msg)
		m.userCount.Add(1)
		m.mu.Unlock()
	case Redirecting:
		m.sinkLocked(msg)
	default: // Closed is terminal: the handler can run without the lock.
		m.mu.Unlock()
		m.closed(msg)
	}
}

func (m *Mailbox) sinkLocked(msg any) {
	defer m.mu.Unlock() // a panicking sink must not leave the mailbox locked
	m.rare.sink(msg)
}

func (m *Mailbox) closed(msg any) {
	if m.hooks != nil {
		m.hooks.Closed(msg)
		return
	}
	m.countDropped()
}

// PostSystemMessage enqueues a system message; system messages are processed
// in every mode.
func (m *Mailbox) PostSystemMessage(message any) {
	if _, stop := message.(*actor.Stop); stop && m.hooks != nil && !m.hooks.StopAllowed() {
		m.hooks.StopRefused(message)
		return
	}
	m.mu.Lock()
	r := m.rareLocked()
	r.sys = append(r.sys, message)
	m.sysCount.Add(1)
	m.mu.Unlock()
	m.schedule()
}

// RegisterHandlers is called by the spawner before Start.
func (m *Mailbox) RegisterHandlers(invoker actor.MessageInvoker, dispatcher actor.Dispatcher) {
	m.invoker = invoker
	m.dispatcher = dispatcher
}

// Start enables scheduling and processes whatever was submitted before (the
// spawner posts *actor.Started just before calling Start, so Started is
// processed before any Do item or user message).
func (m *Mailbox) Start() {
	m.status.Store(idle)
	m.schedule()
}

// UserMessageCount returns the number of user messages the mailbox holds, in
// whichever queue (dispatch queue, ingress hold or temporary queue).
func (m *Mailbox) UserMessageCount() int {
	return int(m.userCount.Load())
}

// Mode returns the current mode. After Seal it stays Open until the seal
// takes effect on the run goroutine, immediately before captured is called.
func (m *Mailbox) Mode() Mode {
	return Mode(m.mode.Load())
}

// Dropped returns how many user messages were posted in Closed mode without
// an OnClosed handler and dropped.
func (m *Mailbox) Dropped() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.rare == nil {
		return 0
	}
	return m.rare.dropped.Load()
}

// Seal asks the mailbox to stop dispatching after the turn in progress.
//
// When no user turn is running — after pending system messages and the Do
// items submitted before it, on the mailbox's run goroutine, so nothing of
// the actor runs concurrently — the mailbox switches to Sealed, removes every
// not-yet-dispatched user message as the saved-work prefix (the original
// posted values, *actor.MessageEnvelope with sender and header intact, in
// posting order; nil when there are none) and calls captured(saved) without
// holding its lock. captured has exclusive access to the actor like a turn,
// and may call the mailbox (Unseal, Redirect, Discard, Do). Messages posted
// after the switch are held. While the actor is suspended (failure awaiting
// its supervisor) the seal waits for the resume, like a turn.
//
// Seal does not wait: captured runs asynchronously on the run goroutine. It
// may run before Seal returns (an idle mailbox is scheduled at once; a
// synchronized dispatcher even runs it inline) or long after (a turn in
// progress), so callers must not rely on either order. Until the switch
// Mode reports Open and a second Seal returns ErrMode.
//
// Seal returns ErrMode if the mode is not Open or a seal is already pending.
// If captured panics the failure is escalated like a failing turn; the
// mailbox stays Sealed and saved has already been handed over.
func (m *Mailbox) Seal(captured func(saved []any)) error { return m.seal("Seal", captured, false) }

// SealFinal is Seal for the end of an incarnation that captures nothing:
// its node lifecycle ended, or it closes. It runs even while the actor is
// suspended (a failure awaiting its restart), with the control items
// before it. An actor that fails at every start is suspended again before
// its mailbox would run a control item, so a plain Seal would wait for it
// forever, and the incarnation would never end; there is no turn to wait
// for and no state to capture. A move's Seal, which captures the actor's
// state, waits for the resume.
func (m *Mailbox) SealFinal(captured func(saved []any)) error {
	return m.seal("SealFinal", captured, true)
}

func (m *Mailbox) seal(op string, captured func(saved []any), end bool) error {
	if captured == nil {
		return fmt.Errorf("%w: Seal", errNilCallback)
	}
	m.mu.Lock()
	mode := Mode(m.mode.Load())
	if mode != Open || m.sealPendingLocked() {
		pending := m.sealPendingLocked()
		m.mu.Unlock()
		return modeError(op, mode, pending)
	}
	m.rareLocked().sealPending = true
	m.pushCtlLocked(ctlItem{seal: captured, end: end})
	m.mu.Unlock()
	m.schedule()
	return nil
}

// Unseal is the single backward edge: from Sealed, it puts saved back at the
// front (ahead of the held messages) in its original order and returns to
// Open, dispatching again. ErrMode from any other mode.
func (m *Mailbox) Unseal(saved []any) error {
	return m.reopen("Unseal", Sealed, func() []any { return saved })
}

// reopen is the one way back to Open: from mode from, it puts front() ahead
// of everything held, drops any sink and schedules dispatch, in one critical
// section, so no post can slip between the two (front runs under the lock).
func (m *Mailbox) reopen(op string, from Mode, front func() []any) error {
	m.mu.Lock()
	if mode := Mode(m.mode.Load()); mode != from {
		pending := m.sealPendingLocked()
		m.mu.Unlock()
		return modeError(op, mode, pending)
	}
	back := front()
	m.user.pushFront(back)
	m.userCount.Add(int32(len(back)))
	if m.rare != nil {
		m.rare.sink = nil
		m.releaseRareLocked()
	}
	m.mode.Store(int32(Open))
	m.mu.Unlock()
	m.schedule()
	return nil
}

// Redirect, from Sealed or Redirecting, hands every held message to sink in
// order, then every later post, in posting order, and returns how many held
// messages it drained. Called again in Redirecting it swaps the sink
// atomically (and returns 0): every message posted before the call went to
// the old sink, every one after to the new. ErrMode otherwise.
//
// The held messages are handed to sink on the calling goroutine, under the
// mailbox lock. If sink panics, the messages not yet handed over stay held
// and the mode stays Sealed.
func (m *Mailbox) Redirect(sink Sink) (int, error) {
	if sink == nil {
		return 0, fmt.Errorf("%w: Redirect", errNilCallback)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch mode := Mode(m.mode.Load()); mode {
	case Sealed:
		n := 0
		for {
			v, ok := m.user.popFront()
			if !ok {
				break
			}
			m.userCount.Add(-1)
			n++
			sink(v)
		}
		m.user.release()
		m.rareLocked().sink = sink
		m.mode.Store(int32(Redirecting))
		return n, nil
	case Redirecting:
		m.rare.sink = sink
		return 0, nil
	default:
		return 0, modeError("Redirect", mode, m.sealPendingLocked())
	}
}

// Reopen, from Redirecting, drops the sink and returns to Open, putting
// prefix() in front of anything posted later. prefix is called under the
// mailbox's lock, after the last call of the sink and before any later post
// is queued, so messages a sink parked can be put back without loss or
// reordering (a relocation that parked its hold while reconciling and then
// got an explicit failure, PROTOCOL.md §6.4). prefix must not call the mailbox.
// ErrMode from any other mode.
func (m *Mailbox) Reopen(prefix func() []any) error {
	if prefix == nil {
		return fmt.Errorf("%w: Reopen", errNilCallback)
	}
	return m.reopen("Reopen", Redirecting, prefix)
}

// OpenWith, from Staging, makes the mailbox dispatch backlog first (in the
// given order), then the temporary queue (what was posted while Staging),
// then later posts. It is atomic: the backlog is put ahead of the temporary
// queue and the mode switched in one critical section, so no post can be
// dispatched before any backlog item (PROTOCOL.md §5.12: the switch to
// ordinary dispatch is one atomic step, and no callback runs under the lock).
// ErrMode from other modes.
func (m *Mailbox) OpenWith(backlog []any) error {
	return m.reopen("OpenWith", Staging, func() []any { return backlog })
}

// Discard, from Staging (target removed) or Sealed/Redirecting, switches to
// Closed and returns every user message it still holds (temporary queue or
// hold; nil in Redirecting, where nothing is held) in order, so the caller
// can fail or forward them. Later posts go to the OnClosed handler. System
// messages and Do items accepted before Discard are still processed.
func (m *Mailbox) Discard() ([]any, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch mode := Mode(m.mode.Load()); mode {
	case Staging, Sealed, Redirecting:
		out := m.user.drain()
		m.userCount.Add(-int32(len(out)))
		if m.rare != nil {
			m.rare.sink = nil
			m.releaseRareLocked()
		}
		m.mode.Store(int32(Closed))
		return out, nil
	default:
		return nil, modeError("Discard", mode, m.sealPendingLocked())
	}
}

// Do runs fn on the mailbox's run goroutine between turns, in any mode
// (also Staging and Sealed): after pending system messages and before the
// next user message, with exclusive access to the actor like a turn. Do
// items run in the order they were submitted (a Seal counts as an item in
// that order). Like user messages they wait while the mailbox is suspended.
// A panic in fn is escalated like a failing turn. A Do submitted to a Closed
// mailbox is not run and returns ErrMode; one accepted before Discard still
// runs.
func (m *Mailbox) Do(fn func()) error {
	if fn == nil {
		return fmt.Errorf("%w: Do", errNilCallback)
	}
	m.mu.Lock()
	if mode := Mode(m.mode.Load()); mode == Closed {
		m.mu.Unlock()
		return modeError("Do", mode, false)
	}
	m.pushCtlLocked(ctlItem{do: fn})
	m.mu.Unlock()
	m.schedule()
	return nil
}

// pushCtlLocked queues it; a SealFinal sets ctlEndSeal with the count, so
// a suspended run loop that sees the count finds the item.
func (m *Mailbox) pushCtlLocked(it ctlItem) {
	r := m.rareLocked()
	r.ctl = append(r.ctl, it)
	n := int32(1)
	if it.end {
		n |= ctlEndSeal
	}
	m.ctlCount.Add(n)
}

func (m *Mailbox) popCtlLocked() ctlItem {
	r := m.rare
	it := r.ctl[0]
	r.ctl[0] = ctlItem{}
	r.ctl = r.ctl[1:]
	if len(r.ctl) == 0 {
		r.ctl = nil
	}
	n := int32(1)
	if it.end {
		n |= ctlEndSeal
	}
	m.ctlCount.Add(-n)
	if it.seal != nil {
		r.sealPending = false
	}
	m.releaseRareLocked()
	return it
}

// popSysLocked takes the first system message; sysCount said there is one.
func (m *Mailbox) popSysLocked() any {
	r := m.rare
	msg := r.sys[0]
	r.sys[0] = nil
	r.sys = r.sys[1:]
	if len(r.sys) == 0 {
		r.sys = nil
	}
	m.sysCount.Add(-1)
	m.releaseRareLocked()
	return msg
}

func (m *Mailbox) schedule() {
	if m.status.CompareAndSwap(idle, running) {
		m.dispatcher.Schedule(m.runFn)
	}
}

// hasWork reports, without the lock, whether a run would do something other
// than system messages: a control item, or a dispatchable user message.
func (m *Mailbox) hasWork() bool {
	return m.ctlItems() > 0 || (Mode(m.mode.Load()) == Open && m.userCount.Load() > 0 && m.gateOpen())
}

func (m *Mailbox) processMessages() {
process:
	m.run()
	if f, ok := m.hooks.(*funcHooks); ok && f.beforeIdle != nil {
		f.beforeIdle()
	}

	// Set the mailbox idle, then re-check for work published after run's
	// last look (its producer's CAS may have failed while we were running).
	m.status.Store(idle)
	if m.sysCount.Load() > 0 || m.endSealQueued() || (!m.suspended.Load() && m.hasWork()) {
		if m.status.CompareAndSwap(idle, running) {
			goto process
		}
	}
}

// run is the default mailbox's loop with control items between system and
// user messages. A panic ends the run and is escalated with the message being
// processed (nil for a Do item or a capture); processMessages then re-checks
// and continues, as the default mailbox does.
func (m *Mailbox) run() {
	var msg any

	defer func() {
		if r := recover(); r != nil {
			m.invoker.EscalateFailure(r, msg)
		}
	}()

	i, t := 0, m.dispatcher.Throughput()
	for {
		if i > t {
			i = 0
			runtime.Gosched()
		}
		i++

		// System messages first, in every mode, until the queue is empty.
		if m.sysCount.Load() > 0 {
			m.mu.Lock()
			msg = m.popSysLocked()
			m.mu.Unlock()
			switch msg.(type) {
			case *actor.SuspendMailbox:
				m.suspended.Store(true)
			case *actor.ResumeMailbox:
				m.suspended.Store(false)
			case *actor.Restart:
				if r, ok := m.hooks.(Restarter); ok {
					r.Restart()
				}
				m.invoker.InvokeSystemMessage(msg)
			default:
				m.invoker.InvokeSystemMessage(msg)
			}
			continue
		}

		// Suspended: no control items and no user messages until resumed,
		// but for the control items up to a SealFinal.
		if m.suspended.Load() && !m.endSealQueued() {
			return // never past the control items while suspended
		}

		// Control items (Do, seal) before the next user message. ctlCount
		// is published under mu before Do/Seal return, and only this
		// goroutine pops, so a positive count means an item is there.
		if m.ctlItems() > 0 {
			msg = nil
			m.mu.Lock()
			it := m.popCtlLocked()
			if it.seal != nil {
				// No turn is running (we are the run goroutine, between
				// turns): switch, and take the saved-work prefix — the
				// batch in hand first, then the rest, in posting order.
				m.mode.Store(int32(Sealed))
				var saved []any
				if n := m.out.len() + m.user.len(); n > 0 {
					saved = m.user.appendTo(m.out.appendTo(make([]any, 0, n)))
				}
				m.userCount.Add(-int32(len(saved)))
				m.mu.Unlock()
				it.seal(saved)
			} else {
				m.mu.Unlock()
				it.do()
			}
			continue
		}

		// Gated: keep every user message queued until Wake.
		if !m.gateOpen() {
			return
		}

		// Dispatch from the batch in hand (non-empty only in Open mode).
		var ok bool
		if msg, ok = m.out.popFront(); ok {
			m.userCount.Add(-1)
			if m.hooks != nil && m.hooks.Intercept(msg) {
				continue
			}
			m.invoker.InvokeUserMessage(msg)
			continue
		}

		// Take the next batch: everything posted so far, by swapping rings.
		m.mu.Lock()
		if Mode(m.mode.Load()) != Open || m.user.len() == 0 {
			// out is drained: it keeps no buffer. With user empty too, the
			// larger of the two waits in user for the next post, so an
			// idle mailbox keeps at most one, not one per ring.
			if m.user.len() == 0 && len(m.out.buf) > len(m.user.buf) {
				m.user.buf, m.user.head = m.out.buf, 0
			}
			m.out.buf, m.out.head = nil, 0
			if m.user.len() == 0 {
				// And not the smallest: most objects are idle and get a
				// message now and then, and a buffer of ringMinCap kept
				// by each was a tenth of an idle Spot's heap. The next
				// post makes one again, one allocation for its batch.
				m.user.dropSmall()
			}
			m.mu.Unlock()
			return
		}
		m.user, m.out = m.out, m.user // out is empty: an O(1) swap
		m.mu.Unlock()
	}
}
