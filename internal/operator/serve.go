package operator

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/roamactors/roam/internal/drain"
	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Handler runs requests on a node.
type Handler interface {
	Drain(ctx context.Context, opts drain.Options) (drain.Result, error)
	Relocate(ctx context.Context, key location.AuthorityKey, target string) (relocation.Outcome, error)
}

// statusEvery bounds how often a running drain rewrites its status note.
const statusEvery = 250 * time.Millisecond

// maxFailures bounds the failures a status note lists.
const maxFailures = 100

// Serve runs, until ctx ends, the requests operators append to the
// requests note of the node lifecycle (mesh, rid): each once, with its
// status note kept up to date, removed from the requests note once its
// final status is written. Store errors are retried.
func Serve(ctx context.Context, clock machine.Clock, board location.Board, mesh, rid string, h Handler, log zerolog.Logger) {
	key := location.NoteKey{Mesh: mesh, NodeRid: rid, Name: RequestsNote}
	started := map[string]bool{}
	statuses := &kept{board: board, mesh: mesh, rid: rid}
	var after location.StoreVersion
	wait := 10 * time.Millisecond
	for ctx.Err() == nil {
		n, err := board.WatchNote(ctx, key, after)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Warn().Str("event", "operator_requests_unreadable").Err(err).Msg("cannot read the operators' requests; retrying")
			_ = machine.Sleep(ctx, clock, wait)
			wait = min(2*wait, 5*time.Second)
			continue
		}
		wait = 10 * time.Millisecond
		after = n.Version
		if n.Version == 0 {
			continue
		}
		var list messages.OperatorRequests
		if err := Decode(n.Value, &list); err != nil {
			log.Warn().Str("event", "operator_request_refused").Err(err).Msg("the requests note is not readable; it is removed")
			_ = board.DeleteNote(ctx, key, n.Version)
			continue
		}
		for _, req := range list.GetRequests() {
			if started[req.GetId()] {
				continue
			}
			started[req.GetId()] = true
			statuses.add(ctx, req.GetId())
			go run(ctx, clock, board, mesh, rid, req, h, log)
		}
	}
}

// keptStatuses is how many status notes a lifecycle keeps: the oldest
// goes when a request beyond it starts, so a long-lived node's notes do
// not pile up (an operator reads a status while following its request).
const keptStatuses = 32

// kept deletes the status notes of all but the last keptStatuses requests.
type kept struct {
	board     location.Board
	mesh, rid string
	ids       []string
}

func (k *kept) add(ctx context.Context, id string) {
	k.ids = append(k.ids, id)
	for len(k.ids) > keptStatuses {
		old := k.ids[0]
		k.ids = k.ids[1:]
		_ = k.board.DeleteNote(ctx, location.NoteKey{Mesh: k.mesh, NodeRid: k.rid, Name: StatusNote(old)}, 0)
	}
}

// run runs one request and reports it.
func run(ctx context.Context, clock machine.Clock, board location.Board, mesh, rid string, req *messages.OperatorRequest, h Handler, log zerolog.Logger) {
	st := &status{clock: clock, board: board, key: location.NoteKey{Mesh: mesh, NodeRid: rid, Name: StatusNote(req.GetId())}}
	st.s = &messages.OperatorStatus{RequestId: req.GetId(), State: messages.OperatorState_OPERATOR_STATE_RUNNING, StartedUnixNanos: clock.Now().UnixNano()}
	if !st.claim(ctx) {
		return // another run of this lifecycle took it, or the store is gone
	}
	log.Info().Str("event", "operator_request").Str("request_id", req.GetId()).Str("requested_by", req.GetRequestedBy()).
		Str("op", opName(req)).Msg("running an operator's request")
	rctx := ctx
	if dl := req.GetDeadlineUnixNanos(); dl > 0 {
		var cancel context.CancelFunc
		rctx, cancel = machine.WithDeadline(ctx, clock, time.Unix(0, dl))
		defer cancel()
	}
	var err error
	switch {
	case req.GetNodeRid() != rid:
		err = errors.Join(roamerr.ErrStale, errors.New("the request names another node lifecycle"))
	case req.GetDrain() != nil:
		err = st.drain(rctx, h, int(req.GetDrain().GetConcurrency()))
	case req.GetMove() != nil:
		m := req.GetMove()
		var out relocation.Outcome
		st.update(func(s *messages.OperatorStatus) { s.Total = 1 })
		out, err = h.Relocate(rctx, location.Key(m.GetKind(), m.GetId()), m.GetTarget())
		if err == nil {
			st.update(func(s *messages.OperatorStatus) {
				s.Moved, s.PauseP50Nanos, s.PauseP99Nanos = 1, int64(out.Pause), int64(out.Pause)
			})
		}
	default:
		err = errors.Join(roamerr.ErrInvalidOperation, errors.New("a request with no operation"))
	}
	st.update(func(s *messages.OperatorStatus) {
		s.State = messages.OperatorState_OPERATOR_STATE_DONE
		if err != nil {
			s.State, s.Error, s.Code = messages.OperatorState_OPERATOR_STATE_FAILED, err.Error(), roamerr.Code(err)
		}
		s.FinishedUnixNanos = st.clock.Now().UnixNano()
	})
	st.flush(context.WithoutCancel(ctx))
	removeRequest(context.WithoutCancel(ctx), board, mesh, rid, req.GetId())
}

func opName(req *messages.OperatorRequest) string {
	switch {
	case req.GetDrain() != nil:
		return "drain"
	case req.GetMove() != nil:
		return "move"
	}
	return "none"
}

// removeRequest takes a finished request off the requests note.
func removeRequest(ctx context.Context, board location.Board, mesh, rid, id string) {
	_ = editRequests(ctx, board, location.NoteKey{Mesh: mesh, NodeRid: rid, Name: RequestsNote}, func(list *messages.OperatorRequests) error {
		list.Requests = slices.DeleteFunc(list.Requests, func(r *messages.OperatorRequest) bool { return r.GetId() == id })
		return nil
	})
}

// status is a request's status note, written by its run alone.
type status struct {
	clock   machine.Clock
	board   location.Board
	key     location.NoteKey
	mu      sync.Mutex
	s       *messages.OperatorStatus
	version location.StoreVersion
	dirty   bool
}

// claim creates the status note; false if it exists (the request ran).
func (st *status) claim(ctx context.Context) bool {
	b, err := Encode(st.s)
	if err != nil {
		return false
	}
	v, err := st.board.WriteNote(ctx, st.key, 0, b)
	if err != nil {
		return false
	}
	st.version = v
	return true
}

func (st *status) update(f func(*messages.OperatorStatus)) {
	st.mu.Lock()
	defer st.mu.Unlock()
	f(st.s)
	st.s.UpdatedUnixNanos = st.clock.Now().UnixNano()
	st.dirty = true
}

// flush writes the status if it changed; a conflict (someone else wrote
// it) is overwritten: the run owns its status note.
func (st *status) flush(ctx context.Context) {
	st.mu.Lock()
	if !st.dirty {
		st.mu.Unlock()
		return
	}
	b, err := Encode(st.s)
	st.dirty = false
	st.mu.Unlock()
	if err != nil {
		return
	}
	for attempt := 0; attempt < 5; attempt++ {
		v, err := st.board.WriteNote(ctx, st.key, st.version, b)
		if err == nil {
			st.version = v
			return
		}
		if !errors.Is(err, location.ErrConflict) {
			return
		}
		n, rerr := st.board.ReadNote(ctx, st.key)
		if rerr != nil {
			st.version = 0
			continue
		}
		st.version = n.Version
	}
}

// drain runs a drain, rewriting the status at most every statusEvery.
func (st *status) drain(ctx context.Context, h Handler, concurrency int) error {
	done := make(chan struct{})
	flushed := make(chan struct{})
	go func() {
		defer close(flushed)
		for {
			tick, t := machine.NewTimer(st.clock, statusEvery)
			select {
			case <-done:
				t.Stop()
				return
			case <-tick:
				st.flush(ctx)
			}
		}
	}()
	res, err := h.Drain(ctx, drain.Options{Concurrency: concurrency, OnProgress: func(p drain.Progress) {
		st.update(func(s *messages.OperatorStatus) {
			s.Total, s.Moved, s.Failed = uint32(p.Total), uint32(p.Moved), uint32(p.Failed)
			if p.Unit.Err != nil && len(s.Failures) < maxFailures {
				s.Failures = append(s.Failures, unitFailure(p.Unit))
			}
		})
	}})
	close(done)
	<-flushed
	st.update(func(s *messages.OperatorStatus) {
		s.Total, s.Moved, s.Failed = uint32(res.Total), uint32(res.Moved), uint32(len(res.Failed))
		s.Failures = s.Failures[:0]
		for _, f := range res.Failed {
			if len(s.Failures) == maxFailures {
				break
			}
			s.Failures = append(s.Failures, unitFailure(f))
		}
		s.PauseP50Nanos, s.PauseP99Nanos = int64(res.PauseP50), int64(res.PauseP99)
	})
	return err
}

func unitFailure(u drain.UnitResult) *messages.UnitFailure {
	return &messages.UnitFailure{Kind: u.Key.Kind, Id: u.Key.ID, Error: u.Err.Error(), Code: roamerr.Code(u.Err)}
}
