package meshnode

import (
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// watchLedger bounds the watches peers hold on a node's actors. A watch
// (actor.Watch from another process) is kept by the watched actor until
// it stops or the watcher unwatches, whether or not the watcher still
// exists, so a peer sending watches with ever new watcher IDs would grow
// that actor without bound. The ledger admits a watch only within
// Limits.MaxRemoteWatches in all and MaxRemoteWatchesPerPeer for one peer
// address, and forgets a watch when it is unwatched or its actor is gone.
type watchLedger struct {
	sys    *actor.ActorSystem
	limits Limits
	counts *refusals

	mu      sync.Mutex
	held    map[watchKey]string // → the peer address that sent it
	perPeer map[string]int
	pruned  time.Time // the last scan for watches of stopped actors
}

type watchKey struct{ watchee, watcherAddress, watcherID string }

func newWatchLedger(sys *actor.ActorSystem, l Limits, counts *refusals) *watchLedger {
	return &watchLedger{sys: sys, limits: l, counts: counts, held: map[watchKey]string{}, perPeer: map[string]int{}}
}

// admit reports whether peer's watch of watchee by watcher may go on.
func (w *watchLedger) admit(peer, watchee string, watcher *actor.PID) bool {
	k := watchKey{watchee, watcher.GetAddress(), watcher.GetId()}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.held[k]; ok {
		return true // the actor keeps a watcher once
	}
	if w.full(peer) && time.Since(w.pruned) >= time.Second {
		w.prune()
	}
	if w.full(peer) {
		w.counts.watches.Add(1)
		return false
	}
	w.held[k] = peer
	w.perPeer[peer]++
	return true
}

func (w *watchLedger) full(peer string) bool {
	return len(w.held) >= w.limits.MaxRemoteWatches || w.perPeer[peer] >= w.limits.MaxRemoteWatchesPerPeer
}

// release forgets an unwatched watch.
func (w *watchLedger) release(watchee string, watcher *actor.PID) {
	k := watchKey{watchee, watcher.GetAddress(), watcher.GetId()}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.forget(k)
}

func (w *watchLedger) forget(k watchKey) {
	peer, ok := w.held[k]
	if !ok {
		return
	}
	delete(w.held, k)
	if w.perPeer[peer]--; w.perPeer[peer] <= 0 {
		delete(w.perPeer, peer)
	}
}

// prune forgets the watches of actors that have stopped (their watchers
// went with them). At most once a second: a flood at the limit must not
// cost a scan per message.
func (w *watchLedger) prune() {
	w.pruned = time.Now()
	for k := range w.held {
		if _, alive := w.sys.ProcessRegistry.GetLocal(k.watchee); !alive {
			w.forget(k)
		}
	}
}
