package mailbox

import (
	"sync/atomic"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
)

type benchMsg struct{}

// one preallocated message, so the benchmark measures the mailbox and not
// boxing of the payload.
var theBenchMsg = &benchMsg{}

// benchMailboxes are the two mailboxes under comparison, in the same process.
var benchMailboxes = []struct {
	name     string
	producer func() actor.MailboxProducer
}{
	{"relocation", func() actor.MailboxProducer { return Producer(nil) }},
	{"default", func() actor.MailboxProducer { return actor.Unbounded() }},
}

// countingInvoker is a MessageInvoker that closes done after n user messages.
type countingInvoker struct {
	n    int64
	seen atomic.Int64
	done chan struct{}
}

func (c *countingInvoker) InvokeSystemMessage(any) {}
func (c *countingInvoker) InvokeUserMessage(any) {
	if c.seen.Add(1) == c.n {
		close(c.done)
	}
}
func (c *countingInvoker) EscalateFailure(reason any, _ any) { panic(reason) }

// BenchmarkOpenPostDispatch measures Open-mode posting plus dispatch of b.N
// user messages, for this mailbox and for Proto.Actor's default unbounded
// mailbox (actor.Unbounded()), so the overhead ratio is visible:
//
//   - actor: one poster sends through the RootContext to a spawned actor
//     (full Proto.Actor path: process registry, actorContext, Receive).
//   - raw: one poster calls PostUserMessage on a bare mailbox with a counting
//     invoker and the default dispatcher (throughput 300): mailbox cost only.
//   - raw-parallel: the same with GOMAXPROCS concurrent posters.
func BenchmarkOpenPostDispatch(b *testing.B) {
	b.Run("actor", func(b *testing.B) {
		for _, mb := range benchMailboxes {
			b.Run(mb.name, func(b *testing.B) {
				system := actor.NewActorSystem(quietLogger())
				defer system.Shutdown()
				n := b.N
				done := make(chan struct{})
				seen := 0
				props := actor.PropsFromFunc(func(ctx actor.Context) {
					if _, ok := ctx.Message().(*benchMsg); ok {
						seen++
						if seen == n {
							close(done)
						}
					}
				}, actor.WithMailbox(mb.producer()))
				pid := system.Root.Spawn(props)
				b.ReportAllocs()
				b.ResetTimer()
				for range n {
					system.Root.Send(pid, theBenchMsg)
				}
				<-done
				b.StopTimer()
				system.Root.Stop(pid)
			})
		}
	})
	b.Run("raw", func(b *testing.B) {
		for _, mb := range benchMailboxes {
			b.Run(mb.name, func(b *testing.B) {
				inv := &countingInvoker{n: int64(b.N), done: make(chan struct{})}
				m := mb.producer()()
				m.RegisterHandlers(inv, actor.NewDefaultDispatcher(300))
				m.Start()
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					m.PostUserMessage(theBenchMsg)
				}
				<-inv.done
			})
		}
	})
	b.Run("raw-parallel", func(b *testing.B) {
		for _, mb := range benchMailboxes {
			b.Run(mb.name, func(b *testing.B) {
				inv := &countingInvoker{n: int64(b.N), done: make(chan struct{})}
				m := mb.producer()()
				m.RegisterHandlers(inv, actor.NewDefaultDispatcher(300))
				m.Start()
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						m.PostUserMessage(theBenchMsg)
					}
				})
				<-inv.done
			})
		}
	})
}
