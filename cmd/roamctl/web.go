package main

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"time"

	"github.com/roamactors/roam/internal/operator"
	"github.com/roamactors/roam/location"
)

//go:embed web/index.html
var webPage []byte

// webState is what the web view shows, read from the store each time
// (GET /api/state).
type webState struct {
	Nodes     []nodeJSON      `json:"nodes"`
	Placement []placementJSON `json:"placement"`
	Moves     []moveLine      `json:"moves"`  // the nodes' recent moves, newest first
	Pauses    []pauseBucket   `json:"pauses"` // those moves' pauses
	// Ended are the objects whose owner is no live node: not served until
	// a live node recovers them, or an operator releases them.
	Ended []recordJSON `json:"ended"`
}

type pauseBucket struct {
	Label string `json:"label"`
	Count int    `json:"count"`
}

// pauseBounds are the histogram's upper bounds, in milliseconds.
var pauseBounds = []float64{1, 2, 5, 10, 20, 50, 100, 200, 500}

// maxWebMoves is how many moves the page lists.
const maxWebMoves = 100

// Web serves the web view on listen until ctx ends: the nodes with their
// load and capacity, the placement director of each mesh, the last moves
// (from, to, pause) and their pause histogram, refreshed every second by
// the page. Like every command it reads only the store.
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
	srv := &http.Server{Handler: c.webHandler(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func (c *ctl) webHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(webPage)
	})
	mux.HandleFunc("GET /api/state", func(w http.ResponseWriter, r *http.Request) {
		s, err := c.webState(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = writeJSON(w, s)
	})
	return mux
}

func (c *ctl) webState(ctx context.Context) (*webState, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	nodes, dir, ended, err := c.nodeLoads(ctx)
	if err != nil {
		return nil, err
	}
	p, err := c.placementOf(ctx, dir)
	if err != nil {
		return nil, err
	}
	s := &webState{Nodes: nodes, Placement: p, Moves: []moveLine{}, Ended: ended}
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
