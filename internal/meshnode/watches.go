package meshnode

import (
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/roamactors/roam/internal/machine"
)

// watchLedger bounds the watches peers hold on a node's actors. A watch
// (actor.Watch from another process) is kept by the watched actor until
// it stops or the watcher unwatches, whether or not the watcher still
// exists, so a peer sending watches with ever new watcher IDs would grow
// that actor without bound. The ledger admits a watch only within
// Limits.MaxRemoteWatches in all and MaxRemoteWatchesPerPeer for one
// budget (a peer's certificate, or its address), and a watch lasts as
// long as the stream that brought it: when the stream ends, the watcher's
// side took its watches for ended (Proto.Actor tells its watchers their
// watchees terminated), so the ledger unwatches them for it.
type watchLedger struct {
	sys    *actor.ActorSystem
	limits Limits
	counts *refusals

	mu      sync.Mutex
	held    map[watchKey]heldWatch
	perPeer map[string]int
	pruned  time.Time // the last scan for watches of stopped actors
}

type watchKey struct{ watchee, watcherAddress, watcherID string }

type heldWatch struct {
	budget string
	stream *guardedStream // that brought it
}

func newWatchLedger(sys *actor.ActorSystem, l Limits, counts *refusals) *watchLedger {
	return &watchLedger{sys: sys, limits: l, counts: counts, held: map[watchKey]heldWatch{}, perPeer: map[string]int{}}
}

// admit reports whether a watch of watchee by watcher, from stream and
// taking budget's share, may go on.
func (w *watchLedger) admit(stream *guardedStream, budget, watchee string, watcher *actor.PID) bool {
	k := watchKey{watchee, watcher.GetAddress(), watcher.GetId()}
	w.mu.Lock()
	defer w.mu.Unlock()
	if h, ok := w.held[k]; ok {
		h.stream = stream // the actor keeps a watcher once
		w.held[k] = h
		return true
	}
	if w.full(budget) && machine.Since(machine.Real, w.pruned) >= time.Second {
		w.prune()
	}
	if w.full(budget) {
		w.counts.watches.Add(1)
		return false
	}
	w.held[k] = heldWatch{budget: budget, stream: stream}
	w.perPeer[budget]++
	return true
}

func (w *watchLedger) full(budget string) bool {
	return len(w.held) >= w.limits.MaxRemoteWatches || w.perPeer[budget] >= w.limits.MaxRemoteWatchesPerPeer
}

// release forgets an unwatched watch.
func (w *watchLedger) release(watchee string, watcher *actor.PID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.forget(watchKey{watchee, watcher.GetAddress(), watcher.GetId()})
}

func (w *watchLedger) forget(k watchKey) {
	h, ok := w.held[k]
	if !ok {
		return
	}
	delete(w.held, k)
	if w.perPeer[h.budget]--; w.perPeer[h.budget] <= 0 {
		delete(w.perPeer, h.budget)
	}
}

// ended unwatches, for their watchers, the watches stream brought.
func (w *watchLedger) ended(stream *guardedStream) {
	w.mu.Lock()
	var gone []watchKey
	for k, h := range w.held {
		if h.stream == stream {
			gone = append(gone, k)
			w.forget(k)
		}
	}
	w.mu.Unlock()
	for _, k := range gone {
		if p, ok := w.sys.ProcessRegistry.GetLocal(k.watchee); ok {
			p.SendSystemMessage(actor.NewPID(w.sys.Address(), k.watchee), &actor.Unwatch{Watcher: actor.NewPID(k.watcherAddress, k.watcherID)})
		}
	}
}

// prune forgets the watches of actors that have stopped (their watchers
// went with them). At most once a second: a flood at the limit must not
// cost a scan per message.
func (w *watchLedger) prune() {
	w.pruned = machine.Real.Now()
	for k := range w.held {
		if _, alive := w.sys.ProcessRegistry.GetLocal(k.watchee); !alive {
			w.forget(k)
		}
	}
}

// count is how many watches the ledger holds.
func (w *watchLedger) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.held)
}
