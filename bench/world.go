package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/location"
)

// blob is the measured Spot: size bytes of state that move with it and a
// counter of the numbered sends it handled. A Int64Value sets the state
// size; a StringValue is a request answered with the count.
type blob struct {
	state   []byte
	handled uint64
}

func (b *blob) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *wrapperspb.Int64Value:
		b.state = make([]byte, m.Value)
		for i := range b.state {
			b.state[i] = byte(i * 31)
		}
		c.Respond(m)
	case *wrapperspb.UInt64Value:
		b.handled++
	case *wrapperspb.StringValue:
		c.Respond(wrapperspb.UInt64(b.handled))
	}
}

type blobState struct{}

func (blobState) Capture(a actor.Actor) ([]byte, error) {
	b := a.(*blob)
	out := make([]byte, 8, 8+len(b.state))
	for i := 0; i < 8; i++ {
		out[i] = byte(b.handled >> (8 * i))
	}
	return append(out, b.state...), nil
}

func (blobState) Restore(a actor.Actor, s []byte) error {
	b := a.(*blob)
	if len(s) < 8 {
		return fmt.Errorf("blob state of %d bytes", len(s))
	}
	for i := 0; i < 8; i++ {
		b.handled |= uint64(s[i]) << (8 * i)
	}
	b.state = s[8:]
	return nil
}

var blobKind = extension.Kind{StableType: "blob", Instance: true, Producer: func() actor.Actor { return &blob{} },
	Policy: extension.PreserveStateWith(blobState{})}

// crewKind is a SpotWide User Spot of blobs: it moves with its members.
var crewKind = extension.Kind{StableType: "crew", SpotWide: true, Producer: func() actor.Actor { return &blob{} },
	Policy: extension.PreserveStateWith(blobState{})}

// world is two or three roam nodes on one store, with the pauses of the
// moves that ended on them.
type world struct {
	store location.Store // the store the world was started on
	// clients: the other nodes' own clients of store (clients.another),
	// closed with the world so that no run leaves connections behind.
	clients []location.Store
	nodes   []*extension.Extension
	mu      sync.Mutex
	pauses  []time.Duration
}

// clients is a store each node of a world reaches through a client of its
// own, as separate processes would (a Consul client batches only its own
// process's calls).
type clients interface {
	location.Store
	another() (location.Store, error)
}

func startWorld(ctx context.Context, store location.Store, n int, opts ...func(*extension.Config)) (*world, error) {
	w := &world{store: store}
	log := zerolog.Nop()
	if os.Getenv("ROAM_BENCH_DEBUG") != "" {
		zerolog.TimeFieldFormat = zerolog.TimeFormatUnixMicro
		log = zerolog.New(os.Stderr).Level(zerolog.DebugLevel).With().Timestamp().Logger()
	}
	silent := slog.LevelError + 4
	for i := 0; i < n; i++ {
		nodeStore := store
		if c, ok := store.(clients); ok && i > 0 {
			var err error
			if nodeStore, err = c.another(); err != nil {
				w.stop(ctx)
				return nil, err
			}
			w.clients = append(w.clients, nodeStore)
		}
		cfg := extension.Config{
			Node:  meshnode.Config{Store: nodeStore, Logger: &log, ProtoActorLogLevel: &silent},
			Kinds: []extension.Kind{blobKind, crewKind},
			// A benchmark's teardown stops every node: nowhere to drain to.
			StopWithoutDrain: true,
			Relocation: relocation.Config{OnEvent: func(ev extension.Event) {
				if ev.Err == nil {
					w.mu.Lock()
					w.pauses = append(w.pauses, ev.Pause)
					w.mu.Unlock()
				}
			}},
		}
		for _, o := range opts {
			o(&cfg)
		}
		e, err := extension.Start(ctx, cfg)
		if err != nil {
			w.stop(ctx)
			return nil, err
		}
		w.nodes = append(w.nodes, e)
	}
	return w, nil
}

// openWorld opens a store and starts n nodes on it; done stops the nodes
// and closes the store.
func openWorld(ctx context.Context, newStore func() (location.Store, error), n int) (*world, func(), error) {
	store, err := newStore()
	if err != nil {
		return nil, nil, err
	}
	w, err := startWorld(ctx, store, n)
	if err != nil {
		_ = store.Close()
		return nil, nil, err
	}
	return w, func() { w.stop(ctx); _ = store.Close() }, nil
}

func (w *world) stop(ctx context.Context) {
	for _, n := range w.nodes {
		_ = n.Stop(ctx)
	}
	for _, c := range w.clients {
		_ = c.Close()
	}
	w.clients = nil
}

// takePauses returns and clears the recorded pauses.
// pauseCount is how many pauses the world holds now.
func (w *world) pauseCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.pauses)
}

func (w *world) takePauses() []time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := w.pauses
	w.pauses = nil
	return p
}

// activate creates the blob Spot id with size bytes of state.
func (w *world) activate(ctx context.Context, id string, size int) error {
	_, err := w.nodes[0].Spots().Request(id, wrapperspb.Int64(int64(size))).InstanceSpot("blob").Timeout(30 * time.Second).Do(ctx)
	return err
}

// owner returns the index of the node that owns id now.
func (w *world) owner(ctx context.Context, id string) (int, error) {
	ref, err := w.nodes[0].Spots().Find(ctx, id)
	if err != nil {
		return 0, err
	}
	for i, n := range w.nodes {
		if n.NodeRid() == ref.NodeRid {
			return i, nil
		}
	}
	return 0, fmt.Errorf("owner %s of %s is not in this world", ref.NodeRid, id)
}

// move relocates id from its owner to the next node.
func (w *world) move(ctx context.Context, id string) (extension.Outcome, error) {
	from, err := w.owner(ctx, id)
	if err != nil {
		return extension.Outcome{}, err
	}
	to := (from + 1) % len(w.nodes)
	return w.nodes[from].Relocate(ctx, extension.InstanceSpotRef(id), w.nodes[to].NodeRid())
}
