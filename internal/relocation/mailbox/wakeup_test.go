package mailbox

import (
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNoLostWakeupWhenWorkRacesTheLoopGoingIdle: many short bursts in which
// posts, Do items, Unseal, OpenWith and ResumeMailbox race the run loop
// finishing and going idle; each burst is awaited on a WaitGroup with a
// deadline, so a lost wake-up (work accepted while the loop decides to stop,
// never scheduled) fails the test instead of passing by luck. Nothing sleeps.
// Reference: the package comment ("Scheduling and concurrency")
func TestNoLostWakeupWhenWorkRacesTheLoopGoingIdle(t *testing.T) {
	system := newSystem(t)
	rounds := 2000
	if testing.Short() {
		rounds = 200
	}

	// wgActor calls Done on the WaitGroup carried by each message.
	wgActor := func(ctx actor.Context) {
		if wg, ok := ctx.Message().(*sync.WaitGroup); ok {
			wg.Done()
		}
	}

	t.Run("PostAndDo", func(t *testing.T) {
		// Each message's handler starts the next post and a Do from new
		// goroutines, so they land while the loop is finishing the turn and
		// going idle; a burst is a chain of such hops, plus a chain of Do
		// items that each submit the next.
		const hops = 20
		var mb *Mailbox // assigned before the first message; read by the handler
		var pid *actor.PID
		pid, mb = spawn(t, system, func(ctx actor.Context) {
			if h, ok := ctx.Message().(hop); ok {
				h.wg.Done()
				if h.left > 0 {
					self := ctx.Self()
					go system.Root.Send(self, hop{h.wg, h.left - 1})
					go func() { assert.NoError(t, mb.Do(h.wg.Done)) }()
				}
			}
		})
		for r := range rounds {
			var wg sync.WaitGroup
			wg.Add(1 + 2*hops + 1 + hops)
			system.Root.Send(pid, hop{&wg, hops})
			require.NoError(t, mb.Do(doChain(mb, &wg, hops)))
			waitWG(t, &wg, "burst "+strconv.Itoa(r))
		}
	})

	t.Run("SealUnseal", func(t *testing.T) {
		pid, mb := spawn(t, system, wgActor)
		for r := range rounds {
			var wg sync.WaitGroup
			wg.Add(3)
			system.Root.Send(pid, &wg) // saved or dispatched, racing the seal
			saved := sealSync(t, mb)   // captured raced the loop going idle
			system.Root.Send(pid, &wg) // held
			go system.Root.Send(pid, &wg)
			require.NoError(t, mb.Unseal(saved)) // races the loop finishing the capture
			waitWG(t, &wg, "burst "+strconv.Itoa(r))
			require.Equal(t, Open, mb.Mode())
		}
	})

	t.Run("SuspendResume", func(t *testing.T) {
		pid, mb := spawn(t, system, wgActor)
		for r := range rounds {
			var wg sync.WaitGroup
			wg.Add(3)
			mb.PostSystemMessage(&actor.SuspendMailbox{})
			go system.Root.Send(pid, &wg)
			go func() { assert.NoError(t, mb.Do(wg.Done)) }()
			system.Root.Send(pid, &wg)
			mb.PostSystemMessage(&actor.ResumeMailbox{})
			waitWG(t, &wg, "burst "+strconv.Itoa(r))
		}
	})

	t.Run("OpenWith", func(t *testing.T) {
		n := rounds / 10
		for r := range n {
			pid, mb := spawn(t, system, wgActor, StartStaging())
			var wg sync.WaitGroup
			wg.Add(4)
			go system.Root.Send(pid, &wg)
			go func() { assert.NoError(t, mb.Do(wg.Done)) }()
			require.NoError(t, mb.OpenWith([]any{&wg}))
			system.Root.Send(pid, &wg)
			waitWG(t, &wg, "burst "+strconv.Itoa(r))
			system.Root.Stop(pid)
		}
	})

	t.Run("RawMailbox", func(t *testing.T) {
		// A bare mailbox and a trivial invoker make the run loop very short,
		// so it goes idle between almost every pair of posts: chained hops
		// (each handler posts the next message and a Do from new goroutines)
		// plus concurrent producers.
		const hops = 20
		m := New()
		m.RegisterHandlers(&hopInvoker{m: m}, actor.NewDefaultDispatcher(1))
		m.Start()
		for r := range rounds {
			var wg sync.WaitGroup
			const producers = 2
			wg.Add(1 + 2*hops + producers*2 + 1 + hops)
			m.PostUserMessage(hop{&wg, hops})
			require.NoError(t, m.Do(doChain(m, &wg, hops)))
			for range producers {
				go func() {
					assert.NoError(t, m.Do(wg.Done))
					m.PostUserMessage(hop{&wg, 0})
				}()
			}
			waitWG(t, &wg, "burst "+strconv.Itoa(r))
		}
		require.Equal(t, 0, m.UserMessageCount())
	})
}

// hop is a chained stress message: its handler calls wg.Done and, while
// left > 0, posts the next hop and submits a Do (wg.Done) from new goroutines.
type hop struct {
	wg   *sync.WaitGroup
	left int
}

// doChain returns a Do function that calls wg.Done and, while left > 0,
// submits the next link from a new goroutine: Do items alone racing the loop
// going idle, with no user message to rescue a stranded one.
func doChain(m *Mailbox, wg *sync.WaitGroup, left int) func() {
	return func() {
		wg.Done()
		if left > 0 {
			go func() {
				if err := m.Do(doChain(m, wg, left-1)); err != nil {
					panic(err)
				}
			}()
		}
	}
}

type hopInvoker struct{ m *Mailbox }

func (*hopInvoker) InvokeSystemMessage(any) {}
func (h *hopInvoker) InvokeUserMessage(msg any) {
	x := msg.(hop)
	x.wg.Done()
	if x.left > 0 {
		go h.m.PostUserMessage(hop{x.wg, x.left - 1})
		go func() {
			if err := h.m.Do(x.wg.Done); err != nil {
				panic(err)
			}
		}()
	}
}
func (*hopInvoker) EscalateFailure(reason any, _ any) { panic(reason) }

// idleHook runs an armed function once, at the mailbox's next idle
// transition (Mailbox.beforeIdle: after a run, before the mailbox is marked
// idle).
type idleHook struct{ armed atomic.Pointer[func()] }

func (h *idleHook) run() {
	if f := h.armed.Swap(nil); f != nil {
		(*f)()
	}
}

// armSubmit arms the hook to call submit from another goroutine and wait
// until it has returned — so submit publishes its work and tries its
// wake-up CAS while the loop is still marked running, and that CAS fails.
func (h *idleHook) armSubmit(t *testing.T, submit func()) <-chan struct{} {
	fired := make(chan struct{})
	f := func() {
		done := make(chan struct{})
		go func() {
			submit()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(patience(t)):
			t.Error("submit did not return")
		}
		close(fired)
	}
	h.armed.Store(&f)
	return fired
}

// TestNoLostWakeupAtIdleTransition: work submitted exactly in the window
// between the end of a run and the mailbox being marked idle — where the
// submitter's own wake-up CAS fails because the loop still owns the mailbox
// — is picked up by the loop's re-check, for every kind of producer: a post,
// a Do, a Seal, an Unseal, an OpenWith, a ResumeMailbox and another system
// message.
// Reference: the package comment ("Scheduling and concurrency")
func TestNoLostWakeupAtIdleTransition(t *testing.T) {
	system := newSystem(t)
	noop := func() {}
	isTerm := func(v any) bool { _, ok := v.(*actor.Terminated); return ok }
	terminated := func() *actor.Terminated { return &actor.Terminated{Who: system.NewLocalPID("not-a-child")} }

	cases := []struct {
		name    string
		opts    []Option
		setup   func(t *testing.T, pid *actor.PID, mb *Mailbox, rec *recorder)
		trigger func(t *testing.T, mb *Mailbox) // makes the loop run (and go idle)
		submit  func(t *testing.T, pid *actor.PID, mb *Mailbox, rec *recorder)
		want    func([]any) bool
	}{
		{
			name:    "Post",
			trigger: func(t *testing.T, mb *Mailbox) { require.NoError(t, mb.Do(noop)) },
			submit:  func(_ *testing.T, pid *actor.PID, _ *Mailbox, _ *recorder) { system.Root.Send(pid, 1) },
			want:    countOf(1, isInt),
		},
		{
			name:    "Do",
			trigger: func(t *testing.T, mb *Mailbox) { require.NoError(t, mb.Do(noop)) },
			submit: func(t *testing.T, _ *actor.PID, mb *Mailbox, rec *recorder) {
				assert.NoError(t, mb.Do(func() { rec.add("do") }))
			},
			want: countOf(1, func(v any) bool { return v == "do" }),
		},
		{
			name:    "Seal",
			trigger: func(t *testing.T, mb *Mailbox) { require.NoError(t, mb.Do(noop)) },
			submit: func(t *testing.T, _ *actor.PID, mb *Mailbox, rec *recorder) {
				assert.NoError(t, mb.Seal(func([]any) { rec.add("captured") }))
			},
			want: countOf(1, func(v any) bool { return v == "captured" }),
		},
		{
			name: "Unseal",
			setup: func(t *testing.T, pid *actor.PID, mb *Mailbox, _ *recorder) {
				require.Empty(t, sealSync(t, mb))
				system.Root.Send(pid, 1) // held
			},
			trigger: func(t *testing.T, mb *Mailbox) { require.NoError(t, mb.Do(noop)) },
			submit:  func(t *testing.T, _ *actor.PID, mb *Mailbox, _ *recorder) { assert.NoError(t, mb.Unseal(nil)) },
			want:    countOf(1, isInt),
		},
		{
			name: "OpenWith",
			opts: []Option{StartStaging()},
			setup: func(_ *testing.T, pid *actor.PID, _ *Mailbox, _ *recorder) {
				system.Root.Send(pid, 2) // temporary queue
			},
			trigger: func(t *testing.T, mb *Mailbox) { require.NoError(t, mb.Do(noop)) },
			submit: func(t *testing.T, _ *actor.PID, mb *Mailbox, _ *recorder) {
				assert.NoError(t, mb.OpenWith([]any{1}))
			},
			want: countOf(2, isInt),
		},
		{
			name: "ResumeMailbox",
			setup: func(_ *testing.T, pid *actor.PID, mb *Mailbox, _ *recorder) {
				mb.PostSystemMessage(&actor.SuspendMailbox{})
				system.Root.Send(pid, 1)
			},
			trigger: func(t *testing.T, mb *Mailbox) { mb.PostSystemMessage(terminated()) },
			submit: func(_ *testing.T, _ *actor.PID, mb *Mailbox, _ *recorder) {
				mb.PostSystemMessage(&actor.ResumeMailbox{})
			},
			want: countOf(1, isInt),
		},
		{
			name:    "SystemMessage",
			trigger: func(t *testing.T, mb *Mailbox) { require.NoError(t, mb.Do(noop)) },
			submit:  func(_ *testing.T, _ *actor.PID, mb *Mailbox, _ *recorder) { mb.PostSystemMessage(terminated()) },
			want:    countOf(1, isTerm),
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for range 50 {
				rec := &recorder{}
				hook := &idleHook{}
				var mb *Mailbox
				props := actor.PropsFromFunc(recordingActor(rec), actor.WithMailbox(Producer(func(m *Mailbox) {
					m.funcHooks().beforeIdle = hook.run // set before Start
					mb = m
				}, c.opts...)))
				pid := system.Root.Spawn(props)
				rec.waitFor(t, "Started", countOf(1, isStarted))
				if c.setup != nil {
					c.setup(t, pid, mb, rec)
				}
				fired := hook.armSubmit(t, func() { c.submit(t, pid, mb, rec) })
				c.trigger(t, mb)
				recv(t, fired, "the idle hook")
				rec.waitFor(t, "the work submitted at the idle transition", c.want)
				system.Root.Stop(pid)
			}
		})
	}
}
