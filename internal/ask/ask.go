// Package ask is how roam asks another node a question and waits for its
// answer: a reply route of the question's own, with an unguessable ID,
// that takes only the answer to that question from the node asked.
//
// Proto.Actor's futures are named "future$<n>", numbered in order, and
// take the first message that reaches them: anyone who can send to a node
// could answer its questions by spraying replies at the next numbers (a
// forged "moved" for a move that never happened). A question here is
// named by 128 random bits; a reply to it crosses the transport only from
// a connection of the node asked (the node's transport guard checks that
// with Expected before Proto.Actor decodes the message); and it counts
// only if Accept says it answers this question (its type, the operation
// it echoes). Anything else is dropped and counted, and the question
// goes on waiting for the real answer.
package ask

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/ratelog"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// RoutePrefix starts the ID of every question's reply route. It starts
// with "future", as every reply address does, so that the node asked
// treats it as a request's.
const RoutePrefix = "future$roam-ask."

// Question is one question asked of one node.
type Question struct {
	// From is the address of the node asked: a reply that arrives over
	// the transport counts only from a connection of that node. Empty for
	// a question another node may answer (a route barrier follows the
	// object it is sent to and is answered where the object is).
	From string
	// Accept reports whether msg answers this question: its type, and the
	// operation or nonce it must echo. Nil takes any message. A dead
	// letter answer (the target does not exist) and a DeliveryFailed are
	// answers to every question.
	Accept func(msg any) bool
	// What names the question in the refusal log and count
	// ("capability query", "route barrier", …).
	What string
	// Clock is the asking node's clock, which the timeout runs on (Real
	// when nil): a node in logical time gives up on a question when its
	// clock says so, not after real seconds.
	Clock machine.Clock
}

// Ask sends msg to to with a reply route of its own and waits for the
// answer until timeout or ctx ends. It returns the answer, or, as
// Proto.Actor's futures do, actor.ErrTimeout when none came in time and
// actor.ErrDeadLetter when the target does not exist; ctx's error when
// ctx ended first.
func Ask(ctx context.Context, sys *actor.ActorSystem, to *actor.PID, msg any, timeout time.Duration, q Question) (any, error) {
	if waitingN.Add(1) > MaxWaiting {
		waitingN.Add(-1)
		Refuse(q.What, "past the process's limit of questions waiting")
		return nil, fmt.Errorf("%w: %d questions already wait for their answers", roamerr.ErrCapacityExceeded, MaxWaiting)
	}
	defer waitingN.Add(-1)
	p := &route{q: q, ch: make(chan any, 1)}
	id := RoutePrefix + Token()
	pid, ok := sys.ProcessRegistry.Add(p, id)
	if !ok { // 128 random bits: never
		return nil, fmt.Errorf("ask: reply route %s is taken", id)
	}
	pending.Store(id, p)
	defer func() {
		pending.Delete(id)
		sys.ProcessRegistry.Remove(pid)
		finish(id, q.From)
	}()
	if o := observer.Load(); o != nil {
		(*o)(Asked{Route: pid, To: to, Message: msg})
	}
	sys.Root.RequestWithCustomSender(to, msg, pid)
	expired := make(chan struct{})
	t := machine.Or(q.Clock).AfterFunc(timeout, func() { close(expired) })
	defer t.Stop()
	select {
	case r := <-p.ch:
		if _, dead := r.(*actor.DeadLetterResponse); dead {
			return nil, actor.ErrDeadLetter
		}
		return r, nil
	case <-expired:
		return nil, actor.ErrTimeout
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// route is a question's reply process: the first accepted answer is
// the answer; every other message to it is refused.
type route struct {
	q    Question
	ch   chan any
	done atomic.Bool
}

func (p *route) SendUserMessage(_ *actor.PID, message any) {
	_, msg, _ := actor.UnwrapEnvelope(message)
	if !p.answers(msg) {
		Refuse(p.q.What, "not an answer to the question asked")
		return
	}
	if !p.done.CompareAndSwap(false, true) {
		Refuse(p.q.What, "a second answer")
		return
	}
	p.ch <- msg
}

func (p *route) answers(msg any) bool {
	switch msg.(type) {
	case *actor.DeadLetterResponse, *messages.DeliveryFailed:
		return true
	}
	return p.q.Accept == nil || p.q.Accept(msg)
}

// SendSystemMessage: a reply route watches nothing and is watched by
// nobody; a system message to it is refused.
func (p *route) SendSystemMessage(*actor.PID, any) { Refuse(p.q.What, "a system message") }

func (p *route) Stop(*actor.PID) {}

// MaxWaiting bounds the questions a process waits answers for at once:
// a peer's command can make a node ask a question (a command's
// confirmation), so a flood of them must not grow without bound.
const MaxWaiting = 65536

var waitingN atomic.Int64

// pending are the questions waiting for an answer, by reply route ID,
// for the transport guard (Expected). IDs are random, so one map serves
// every actor system in the process.
var pending sync.Map // string → *route

// Expected is what the transport guard asks of a message that arrived
// for reply route id: whether a question waits there, and the address of
// the node asked ("" when any node may answer it).
func Expected(id string) (from, what string, waiting bool) {
	v, ok := pending.Load(id)
	if !ok {
		return "", "", false
	}
	q := v.(*route).q
	return q.From, q.What, true
}

// Late reports whether an answer to id that came from address from is
// late: its question ended in the last minute (it timed out, or was
// answered already) and from is the node it asked. Such an answer is not
// forged: it is dropped and counted as late, not refused.
func Late(id, from string) bool {
	v, ok := finished.Load(id)
	if !ok || v.(ended).from != "" && v.(ended).from != from {
		return false
	}
	late.Add(1)
	return true
}

type ended struct {
	at   time.Time
	from string // the node asked
}

// LateAnswers is how many answers came after their question ended.
func LateAnswers() int64 { return late.Load() }

var (
	// finished are the routes of questions that ended, for a minute.
	finished sync.Map // string → ended
	late     atomic.Int64
	swept    atomic.Int64 // unix nanos of the last sweep
)

// finish records that the question at id ended, and forgets those that
// ended more than a minute ago (swept at most once a second).
func finish(id, from string) {
	now := machine.Real.Now() // process-wide bookkeeping, not a node's protocol time
	finished.Store(id, ended{at: now, from: from})
	if last := swept.Load(); now.UnixNano()-last < int64(time.Second) || !swept.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	finished.Range(func(k, v any) bool {
		if now.Sub(v.(ended).at) > time.Minute {
			finished.Delete(k)
		}
		return true
	})
}

// IsRoute reports whether id names a question's reply route.
func IsRoute(id string) bool { return strings.HasPrefix(id, RoutePrefix) }

// Token is 128 unguessable bits, in 32 hex characters. It draws from a
// pool of ChaCha8 generators (a cryptographic stream cipher), each seeded
// from the system's random source: as unpredictable as crypto/rand
// without a system call per reply route, which a Spot call makes one of.
func Token() string { return string(AppendToken(nil)) }

// AppendToken appends a Token to dst: a caller building a longer name
// allocates it once.
func AppendToken(dst []byte) []byte {
	g := generators.Get().(*rand.ChaCha8)
	var b [16]byte
	_, _ = g.Read(b[:])
	generators.Put(g)
	return hex.AppendEncode(dst, b[:])
}

var generators = sync.Pool{New: func() any {
	var seed [32]byte
	_, _ = crand.Read(seed[:]) // never fails on a supported OS
	return rand.NewChaCha8(seed)
}}

// Asked is what an Observer is told of a question as it is asked.
type Asked struct {
	// Route is the question's reply route.
	Route *actor.PID
	// To is whom it was sent to, and Message what.
	To      *actor.PID
	Message any
}

var observer atomic.Pointer[func(Asked)]

// Observe calls f with every question asked from now on, before it is
// sent; nil stops. It is for tests that play an attacker who learnt a
// question's reply route (by observing the network, or as the node
// asked) and answer it from elsewhere.
func Observe(f func(Asked)) {
	if f == nil {
		observer.Store(nil)
		return
	}
	observer.Store(&f)
}

// refused counts refused answers in this process, for tests and the
// count below.
var refused atomic.Int64

// Refused is how many answers this process refused: forged, misdirected,
// late or not the answer to the question asked.
func Refused() int64 { return refused.Load() }

var refusedLog ratelog.Limiter

// logger is where refusals are logged: the last node's started in this
// process (SetLogger); nothing before one.
var logger atomic.Pointer[zerolog.Logger]

// SetLogger sets where refusals are logged.
func SetLogger(l zerolog.Logger) { logger.Store(&l) }

var refusedCounter = sync.OnceValue(func() metric.Int64Counter {
	c, _ := otel.GetMeterProvider().Meter("github.com/roamactors/roam/internal/ask").Int64Counter("roam.ask.replies_refused",
		metric.WithDescription("answers refused: forged, misdirected, repeated, or not the answer to the question asked, by question"))
	return c
})

// Refuse drops an answer to a question (what) for why: counted, and
// logged at most ten times a second. The transport guard calls it for an
// answer that came from elsewhere than the node asked.
func Refuse(what, why string) {
	refused.Add(1)
	if c := refusedCounter(); c != nil {
		c.Add(context.Background(), 1, metric.WithAttributes(attribute.String("question", what)))
	}
	if l := logger.Load(); l != nil {
		refusedLog.Warn(l).Str("event", "reply_refused").Str("question", what).Str("reason", why).
			Msg("an answer to a question this node asked was refused; the question goes on waiting for its own")
	}
}
