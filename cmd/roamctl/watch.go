package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/roamactors/roam/internal/operator"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

// errEnough ends a watch that printed the moves it was asked for.
var errEnough = errors.New("enough moves")

// moveLine is one line of `watch --json`.
type moveLine struct {
	At       string  `json:"at"`
	Mesh     string  `json:"mesh"`
	Seq      uint64  `json:"seq"`
	Kind     string  `json:"kind"`
	ID       string  `json:"id"`
	From     string  `json:"from"`
	FromRid  string  `json:"from_rid"`
	To       string  `json:"to"`
	ToRid    string  `json:"to_rid"`
	PauseMs  float64 `json:"pause_ms"`
	Bytes    uint64  `json:"bytes"`
	Fallback bool    `json:"fallback"`
}

// watcher prints the moves of every node lifecycle it follows.
type watcher struct {
	c     *ctl
	start time.Time // moves committed before are not printed
	count int       // stop after so many (0: never)
	stop  context.CancelCauseFunc

	mu      sync.Mutex
	names   map[string]string // node RID → name, of every node seen
	printed int
}

// Watch prints the moves the live nodes commit, as they commit them, until
// ctx ends (an interrupt, -timeout) or count moves were printed (count >
// 0). It follows each node lifecycle's moves note and lists the nodes
// every discoverEvery to follow new ones.
func (c *ctl) Watch(ctx context.Context, count int) error {
	if c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	w := &watcher{c: c, start: c.now(), count: count, stop: stop, names: map[string]string{}}

	following := map[location.NodeKey]context.CancelFunc{}
	var wg sync.WaitGroup
	defer func() {
		for _, cancel := range following {
			cancel()
		}
		wg.Wait()
	}()
	announced, hinted := false, false
	for {
		nodes, err := c.store.ListNodes(ctx, c.mesh)
		switch {
		case ctx.Err() != nil:
		case err != nil:
			fmt.Fprintf(c.errOut, "roamctl: list nodes: %v (trying again)\n", err)
		default:
			// Every listed node's name first: a follower started below
			// may print a move from a node later in the listing at once.
			w.mu.Lock()
			for _, vn := range nodes {
				w.names[vn.Node.GetNodeRid()] = nodeName(vn.Node)
			}
			w.mu.Unlock()
			live := map[location.NodeKey]bool{}
			for _, vn := range nodes {
				n, key := vn.Node, location.NodeKeyOf(vn.Node)
				live[key] = true
				if following[key] == nil {
					nctx, cancel := context.WithCancel(ctx)
					following[key] = cancel
					wg.Add(1)
					go func() {
						defer wg.Done()
						w.follow(nctx, n)
					}()
				}
			}
			for key, cancel := range following {
				if !live[key] {
					cancel()
					delete(following, key)
				}
			}
			if len(nodes) == 0 && !hinted {
				fmt.Fprintf(c.errOut, "roamctl: %s; waiting for nodes to start\n", c.noNodesHint(ctx))
				hinted = true
			}
			if !announced && !c.json && c.tty {
				fmt.Fprintf(c.errOut, "watching the moves of %d node(s); Ctrl-C to stop\n", len(following))
			}
			announced = true
		}
		select {
		case <-ctx.Done():
			switch cause := context.Cause(ctx); {
			case errors.Is(cause, errEnough), errors.Is(cause, errInterrupted), errors.Is(cause, context.DeadlineExceeded):
				return nil
			default:
				return cause
			}
		case <-time.After(c.discoverEvery):
		}
	}
}

// follow prints the new moves of one node lifecycle's feed until ctx ends.
func (w *watcher) follow(ctx context.Context, n *location.NodeDescriptor) {
	c := w.c
	mesh, rid := n.GetMesh(), n.GetNodeRid()
	var (
		last uint64
		v    location.StoreVersion
	)
	f, v, err := operator.Feed(ctx, c.board, mesh, rid)
	for err != nil {
		if !sleep(ctx, time.Second) {
			return
		}
		f, v, err = operator.Feed(ctx, c.board, mesh, rid)
	}
	for {
		if moves := f.GetMoves(); last > 0 && len(moves) > 0 && moves[0].GetSeq() > last+1 {
			// The node committed more moves between two reads than its
			// note keeps (operator.FeedLength).
			fmt.Fprintf(c.errOut, "roamctl: %d move(s) to %s not shown: its moves note had moved on\n",
				moves[0].GetSeq()-last-1, nodeName(n))
		}
		for _, m := range f.GetMoves() {
			if m.GetSeq() > last && !time.Unix(0, m.GetAtUnixNanos()).Before(w.start) {
				w.print(mesh, m)
			}
		}
		last = max(last, f.GetSeq())
		f, v, err = operator.WatchFeed(ctx, c.board, mesh, rid, v)
		for err != nil {
			if !sleep(ctx, time.Second) {
				return
			}
			f, v, err = operator.WatchFeed(ctx, c.board, mesh, rid, v)
		}
		if f.GetSeq() < last {
			last = 0 // the note was written anew
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

func (w *watcher) name(rid string) string {
	if n, ok := w.names[rid]; ok {
		return n
	}
	return short(rid)
}

func (w *watcher) print(mesh string, m *messages.MoveRecord) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.count > 0 && w.printed >= w.count {
		return
	}
	w.printed++
	at := time.Unix(0, m.GetAtUnixNanos())
	if w.c.json {
		_ = writeJSON(w.c.out, moveLine{
			At: at.UTC().Format(time.RFC3339Nano), Mesh: mesh, Seq: m.GetSeq(),
			Kind: location.KindName(m.GetKind()), ID: m.GetId(),
			From: w.name(m.GetFromRid()), FromRid: m.GetFromRid(), To: w.name(m.GetToRid()), ToRid: m.GetToRid(),
			PauseMs: ms(m.GetPauseNanos()), Bytes: m.GetBytes(), Fallback: m.GetFallback(),
		})
	} else {
		fallback := ""
		if m.GetFallback() {
			fallback = " (fallback)"
		}
		fmt.Fprintf(w.c.out, "%s  %s  %s → %s  pause %.2fms  %s%s\n", at.Format("15:04:05.000"),
			location.Key(m.GetKind(), m.GetId()), w.name(m.GetFromRid()), w.name(m.GetToRid()),
			ms(m.GetPauseNanos()), bytesStr(m.GetBytes()), fallback)
	}
	if w.count > 0 && w.printed >= w.count {
		w.stop(errEnough)
	}
}
