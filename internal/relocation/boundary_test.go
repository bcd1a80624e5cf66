package relocation_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/messages"
)

// The boundary batch (the messages that reach the source after its seal,
// relayed to the target after relay-ready) is empty whenever every send
// arrives before the seal, and a test of the relay that never relays a
// message passes whatever the relay does. These helpers make the batch
// non-empty on purpose and count what of it reaches the target.

// inboundChain runs several hooks on one driver's relocation actor:
// DropInbound takes one function, and a test may need several (a hold at
// relay-ready beside a lost acknowledgement, say). The first hook that
// drops a message ends its chain.
type inboundChain struct {
	mu    sync.Mutex
	hooks []func(any) bool
}

var inboundChains sync.Map // *relocation.Driver → *inboundChain

// onInbound adds hook to d's chain; hooks run in the order added.
func onInbound(t *testing.T, d *relocation.Driver, hook func(any) bool) {
	t.Helper()
	c, loaded := inboundChains.LoadOrStore(d, &inboundChain{})
	chain := c.(*inboundChain)
	chain.mu.Lock()
	chain.hooks = append(chain.hooks, hook)
	chain.mu.Unlock()
	if !loaded {
		relocation.DropInbound(d, chain.drop)
		t.Cleanup(func() { inboundChains.Delete(d) })
	}
}

func (c *inboundChain) drop(m any) bool {
	c.mu.Lock()
	hooks := c.hooks
	c.mu.Unlock() // a hook may block (relayHold): not under the lock
	for _, h := range hooks {
		if h(m) {
			return true
		}
	}
	return false
}

// moveHold stops a move while its source is sealed, before the source
// relays: a send posted meanwhile waits in the ingress hold and can only
// reach the target in the boundary batch. The relocation actor of the
// held node is blocked until release (a send to the object does not need
// it: the sealed mailbox takes it on the sender's goroutine).
type moveHold struct {
	reached, released chan struct{}
	once              sync.Once
}

// holdAt holds node's relocation actor at the first message match
// reports true for.
func holdAt(t *testing.T, node *testNode, match func(any) bool) *moveHold {
	t.Helper()
	h := &moveHold{reached: make(chan struct{}), released: make(chan struct{})}
	var first atomic.Bool
	onInbound(t, node.driver, func(m any) bool {
		if match(m) && first.CompareAndSwap(false, true) {
			close(h.reached)
			<-h.released
		}
		return false
	})
	t.Cleanup(h.release) // a failed test must not leave the node blocked
	return h
}

// holdAtPrepare holds a move at its target's Restore request: the source
// sealed and captured before it sent it, and nothing on the target runs
// a timer yet, so the hold may last without changing the move's path.
func holdAtPrepare(t *testing.T, target *testNode) *moveHold {
	return holdAt(t, target, func(m any) bool { _, ok := m.(*messages.RelocationPrepare); return ok })
}

// holdAtRelayReady holds a move at its source when the target's
// relay-ready arrives: the target holds the whole payload and waits for
// the cutover, which cannot come while held (the fallback's path).
func holdAtRelayReady(t *testing.T, source *testNode) *moveHold {
	return holdAt(t, source, func(m any) bool { _, ok := m.(*messages.RelayReady); return ok })
}

// wait returns once the move is held.
func (h *moveHold) wait(t *testing.T) {
	t.Helper()
	select {
	case <-h.reached:
	case <-time.After(testwait.Patience(t)):
		t.Fatal("the move never reached the hold")
	}
}

func (h *moveHold) release() { h.once.Do(func() { close(h.released) }) }

// batchWatch counts the distinct boundary-batch records that reach a
// target's relocation actor (a resent record counts once), and whether a
// cutover did. Messages a hook added earlier drops (a cut link) are not
// counted: they did not arrive.
type batchWatch struct {
	mu      sync.Mutex
	indexes map[recordID]bool
	cutover atomic.Bool
}

type recordID struct {
	relocation         uint64
	participant, index uint32
}

func watchBatch(t *testing.T, target *testNode) *batchWatch {
	t.Helper()
	w := &batchWatch{indexes: map[recordID]bool{}}
	onInbound(t, target.driver, func(m any) bool {
		if r, ok := m.(*messages.RelayedRecord); ok {
			w.mu.Lock()
			w.indexes[recordID{r.GetIdentity().GetRelocationId(), r.GetParticipant(), r.GetIndex()}] = true
			w.mu.Unlock()
		}
		if _, ok := m.(*messages.Cutover); ok {
			w.cutover.Store(true)
		}
		return false
	})
	return w
}

// records is how many distinct boundary records reached the target.
func (w *batchWatch) records() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.indexes)
}

// cutoverArrived reports whether a cutover reached the target. The source
// sends it once it relayed its last record and holds later sends.
func (w *batchWatch) cutoverArrived() bool { return w.cutover.Load() }
