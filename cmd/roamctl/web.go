package main

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/roamactors/roam/internal/operator"
	"github.com/roamactors/roam/location"
)

//go:embed web/index.html
var webPage []byte

// webState is what the web view shows (GET /api/state): the store as
// last read, with the history roamctl gathered since it started.
type webState struct {
	Nodes     []nodeJSON      `json:"nodes"`
	Placement []placementJSON `json:"placement"`
	Moves     []moveLine      `json:"moves"`  // the nodes' recent moves, newest first
	Pauses    []pauseBucket   `json:"pauses"` // those moves' pauses
	// Ended are the objects whose owner is no live node: not served until
	// a live node recovers them, or an operator releases them.
	Ended []recordJSON `json:"ended"`
	// Hint says where roamctl looked when it found no live node.
	Hint string `json:"hint,omitempty"`
	// ReadAt is when the store was read for this state (RFC 3339).
	ReadAt string `json:"read_at"`
	// StoreError is why the last read failed ("" when it did not): the
	// state is then the last one read, at ReadAt, kept on screen.
	StoreError      string `json:"store_error,omitempty"`
	StoreErrorSince string `json:"store_error_since,omitempty"`
	// History is the charts' data, over the last historyWindow.
	History *history `json:"history,omitempty"`

	allMoves []moveLine // every move the notes hold, for the history
}

type pauseBucket struct {
	Label string `json:"label"`
	Count int    `json:"count"`
}

// pauseBounds are the histogram's upper bounds, in milliseconds.
var pauseBounds = []float64{1, 2, 5, 10, 20, 50, 100, 200, 500}

// maxWebMoves is how many moves the page lists.
const maxWebMoves = 100

// The charts cover historyWindow in steps of stepEvery.
const (
	historyWindow = 5 * time.Minute
	stepEvery     = 5 * time.Second
)

// webEvery is how often Web reads the store, with or without a page
// open, so that the charts have their history when one opens.
const webEvery = time.Second

// webReadTimeout bounds one read of the store: past it, the page keeps
// the last state, under a banner.
const webReadTimeout = 5 * time.Second

// history is the charts' data: per step, the moves the nodes committed
// (count, pause p50 and p99), and each node's load as sampled.
type history struct {
	StepMs   int64         `json:"step_ms"`
	WindowMs int64         `json:"window_ms"`
	Steps    []historyStep `json:"steps"` // oldest first, the last one ending at the read
	Load     []loadSeries  `json:"load"`
}

type historyStep struct {
	EndMs int64    `json:"end_ms"`
	Moves int      `json:"moves"`
	P50Ms *float64 `json:"p50_ms"` // null: no move in the step
	P99Ms *float64 `json:"p99_ms"`
}

type loadSeries struct {
	Mesh   string     `json:"mesh"`
	Node   string     `json:"node"`
	Points [][2]int64 `json:"points"` // [unix ms, load]
}

// webView serves the web view: it reads the store at most once per
// minRead, keeps the last state it read for when the store does not
// answer, and gathers the charts' history from its reads.
type webView struct {
	c       *ctl
	timeout time.Duration
	minRead time.Duration

	mu         sync.Mutex
	reading    chan struct{} // closed when the read under way ends; nil when none
	last       *webState     // the last state read, nil before the first
	lastRead   time.Time
	storeErr   error
	errSince   time.Time
	seenMoves  map[moveKey]time.Time // every move seen within the window
	movesAt    []pastMove            // the same, oldest first
	loads      map[location.NodeKey]*loadSeries
	loadsOrder []location.NodeKey
}

type moveKey struct {
	mesh, rid string
	seq       uint64
}

type pastMove struct {
	key   moveKey
	at    time.Time
	pause float64 // ms
}

func (c *ctl) newWebView() *webView {
	timeout := webReadTimeout
	if c.webTimeout > 0 {
		timeout = c.webTimeout
	}
	return &webView{c: c, timeout: timeout, minRead: webEvery / 2,
		seenMoves: map[moveKey]time.Time{}, loads: map[location.NodeKey]*loadSeries{}}
}

// Web serves the web view on listen until ctx ends: the nodes with their
// load and capacity, the placement director of each mesh, the last moves
// (from, to, pause) and their pause histogram, and charts of the moves per
// second, their pauses and each node's load over the last minutes. It
// reads the store every second (the page refreshes as often), keeping the
// last state it read on screen while the store does not answer. Like
// every command it reads only the store.
func (c *ctl) Web(ctx context.Context, listen string) error {
	if c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return failf(exitFailed, "listen on %s: %v", listen, err)
	}
	fmt.Fprintf(c.errOut, "roamctl: the web view is at http://%s/\n", ln.Addr())
	v := c.newWebView()
	srv := &http.Server{Handler: v.handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		t := time.NewTicker(webEvery)
		defer t.Stop()
		for {
			v.read(ctx)
			select {
			case <-ctx.Done():
				sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = srv.Shutdown(sctx)
				return
			case <-t.C:
			}
		}
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// webHandler is the web view's handler, reading the store as pages ask.
func (c *ctl) webHandler() http.Handler { return c.newWebView().handler() }

func (v *webView) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(webPage)
	})
	mux.HandleFunc("GET /api/state", func(w http.ResponseWriter, r *http.Request) {
		s := v.state(r.Context())
		w.Header().Set("Cache-Control", "no-store")
		if s.ReadAt == "" {
			// Nothing read yet: no state to keep on screen.
			http.Error(w, s.StoreError, http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = writeJSON(w, s)
	})
	return mux
}

// state reads the store unless it was read within minRead, and returns
// the last state read with the read's error, if any. A read under way is
// not waited for: the page gets the last state at once.
func (v *webView) state(ctx context.Context) webState {
	v.mu.Lock()
	fresh := !v.lastRead.IsZero() && time.Since(v.lastRead) < v.minRead
	reading, first := v.reading, v.last == nil
	v.mu.Unlock()
	if !fresh && reading == nil {
		v.read(ctx)
	} else if reading != nil && first {
		select { // the first read: there is nothing else to show
		case <-reading:
		case <-ctx.Done():
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	var s webState
	if v.last != nil {
		s = *v.last
	}
	if v.storeErr != nil {
		s.StoreError = v.storeErr.Error()
		s.StoreErrorSince = v.errSince.UTC().Format(time.RFC3339Nano)
	}
	return s
}

// read reads the store once (unless a read is under way) and records the
// outcome.
func (v *webView) read(ctx context.Context) {
	v.mu.Lock()
	if v.reading != nil {
		v.mu.Unlock()
		return
	}
	done := make(chan struct{})
	v.reading = done
	v.mu.Unlock()
	defer close(done)

	rctx, cancel := context.WithTimeout(ctx, v.timeout)
	s, err := v.c.webState(rctx)
	cancel()
	now := v.c.now()

	v.mu.Lock()
	defer v.mu.Unlock()
	v.reading = nil
	v.lastRead = now
	if err != nil {
		if ctx.Err() != nil {
			return // the page went away, not the store
		}
		if v.storeErr == nil {
			v.errSince = now
		}
		v.storeErr = err
		return
	}
	v.storeErr = nil
	v.record(s, now)
	s.ReadAt = now.UTC().Format(time.RFC3339Nano)
	s.History = v.history(now)
	v.last = s
}

// record adds a read's moves and loads to the history. Called with v.mu.
func (v *webView) record(s *webState, now time.Time) {
	from := now.Add(-historyWindow)
	for _, m := range s.allMoves {
		k := moveKey{m.Mesh, m.ToRid, m.Seq}
		at, err := time.Parse(time.RFC3339Nano, m.At)
		if _, seen := v.seenMoves[k]; seen || err != nil || at.Before(from) {
			continue
		}
		v.seenMoves[k] = at
		v.movesAt = append(v.movesAt, pastMove{key: k, at: at, pause: m.PauseMs})
	}
	slices.SortStableFunc(v.movesAt, func(a, b pastMove) int { return a.at.Compare(b.at) })
	drop := 0
	for drop < len(v.movesAt) && v.movesAt[drop].at.Before(from) {
		delete(v.seenMoves, v.movesAt[drop].key)
		drop++
	}
	v.movesAt = v.movesAt[drop:]

	ms := now.UnixMilli()
	for _, n := range s.Nodes {
		k := location.NodeKey{Mesh: n.Mesh, NodeRid: n.Rid}
		l := v.loads[k]
		if l == nil {
			name := n.Name
			if name == "" {
				name = short(n.Rid)
			}
			l = &loadSeries{Mesh: n.Mesh, Node: name}
			v.loads[k] = l
			v.loadsOrder = append(v.loadsOrder, k)
		}
		l.Points = append(l.Points, [2]int64{ms, int64(n.Load)})
	}
	v.loadsOrder = slices.DeleteFunc(v.loadsOrder, func(k location.NodeKey) bool {
		l := v.loads[k]
		drop := 0
		for drop < len(l.Points) && l.Points[drop][0] < from.UnixMilli() {
			drop++
		}
		l.Points = l.Points[drop:]
		if len(l.Points) == 0 {
			delete(v.loads, k)
			return true
		}
		return false
	})
}

// history is the charts' data as of now. Called with v.mu.
func (v *webView) history(now time.Time) *history {
	step := stepEvery.Milliseconds()
	end := (now.UnixMilli()/step + 1) * step // the end of the step now is in
	n := int(historyWindow / stepEvery)
	h := &history{StepMs: step, WindowMs: historyWindow.Milliseconds(), Load: []loadSeries{}}
	pauses := make([][]float64, n)
	for _, m := range v.movesAt {
		i := n - 1 - int((end-1-m.at.UnixMilli())/step)
		if i >= 0 && i < n {
			pauses[i] = append(pauses[i], m.pause)
		}
	}
	for i := range n {
		s := historyStep{EndMs: end - int64(n-1-i)*step, Moves: len(pauses[i])}
		if len(pauses[i]) > 0 {
			slices.Sort(pauses[i])
			p50, p99 := percentile(pauses[i], 0.50), percentile(pauses[i], 0.99)
			s.P50Ms, s.P99Ms = &p50, &p99
		}
		h.Steps = append(h.Steps, s)
	}
	for _, k := range v.loadsOrder {
		l := *v.loads[k]
		l.Points = slices.Clone(l.Points)
		h.Load = append(h.Load, l)
	}
	return h
}

// percentile is the nearest-rank percentile q of sorted.
func percentile(sorted []float64, q float64) float64 {
	i := int(float64(len(sorted))*q+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// webState reads the store for the web view.
func (c *ctl) webState(ctx context.Context) (*webState, error) {
	nodes, dir, ended, err := c.nodeLoads(ctx)
	if err != nil {
		return nil, err
	}
	p, err := c.placementOf(ctx, dir)
	if err != nil {
		return nil, err
	}
	s := &webState{Nodes: nodes, Placement: p, Moves: []moveLine{}, Ended: ended}
	if s.Nodes == nil {
		s.Nodes = []nodeJSON{}
		s.Hint = c.noNodesHint(ctx)
	}
	names := map[string]string{}
	for _, n := range dir.nodes {
		names[n.Node.GetNodeRid()] = nodeName(n.Node)
	}
	name := func(rid string) string { return nameOr(names, rid) }
	for _, n := range dir.nodes {
		f, _, err := operator.Feed(ctx, c.board, n.Node.GetMesh(), n.Node.GetNodeRid())
		if err != nil {
			if errors.Is(err, location.ErrNotFound) {
				continue
			}
			return nil, err
		}
		for _, m := range f.GetMoves() {
			s.Moves = append(s.Moves, moveLine{
				At: time.Unix(0, m.GetAtUnixNanos()).UTC().Format(time.RFC3339Nano), Mesh: n.Node.GetMesh(), Seq: m.GetSeq(),
				Kind: location.KindName(m.GetKind()), ID: m.GetId(), From: name(m.GetFromRid()), FromRid: m.GetFromRid(),
				To: name(m.GetToRid()), ToRid: m.GetToRid(), PauseMs: ms(m.GetPauseNanos()), Bytes: m.GetBytes(), Fallback: m.GetFallback(),
			})
		}
	}
	sort.SliceStable(s.Moves, func(i, j int) bool { return s.Moves[i].At > s.Moves[j].At })
	// The history counts every move the notes hold; the page lists the
	// newest.
	s.allMoves = s.Moves
	if len(s.Moves) > maxWebMoves {
		s.Moves = s.Moves[:maxWebMoves]
	}
	counts := make([]int, len(pauseBounds)+1)
	for _, m := range s.Moves {
		i := sort.SearchFloat64s(pauseBounds, m.PauseMs)
		if i < len(pauseBounds) && m.PauseMs == pauseBounds[i] {
			i++ // a bound belongs to the next bucket: "< bound"
		}
		counts[i]++
	}
	for i, n := range counts {
		label := fmt.Sprintf("≥ %g ms", pauseBounds[len(pauseBounds)-1])
		if i < len(pauseBounds) {
			label = fmt.Sprintf("< %g ms", pauseBounds[i])
		}
		s.Pauses = append(s.Pauses, pauseBucket{Label: label, Count: n})
	}
	return s, nil
}
