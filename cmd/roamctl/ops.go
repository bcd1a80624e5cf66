package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/roamactors/roam/internal/operator"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

var (
	errNodeEnded = errors.New("the node's lifecycle ended before roamctl saw the request's final status")
	errNoFinal   = errors.New("no final status by the request's deadline")
)

// request is a request submitted to a node lifecycle.
type request struct {
	node      *location.NodeDescriptor
	req       *messages.OperatorRequest
	submitted time.Time
}

// submit appends a request to node's requests note; op fills its
// operation.
func (c *ctl) submit(ctx context.Context, node *location.NodeDescriptor, op func(*messages.OperatorRequest)) (*request, error) {
	now := c.now()
	req := &messages.OperatorRequest{
		Id:                 uuid.NewString(),
		NodeRid:            node.GetNodeRid(),
		RequestedUnixNanos: now.UnixNano(),
		RequestedBy:        c.who,
	}
	if c.timeout > 0 {
		req.DeadlineUnixNanos = now.Add(c.timeout).UnixNano()
	}
	op(req)
	if err := operator.Submit(ctx, c.board, node.GetMesh(), req); err != nil {
		return nil, fmt.Errorf("submit the request to %s: %w", nodeName(node), err)
	}
	return &request{node: node, req: req, submitted: now}, nil
}

func final(st *messages.OperatorStatus) bool {
	s := st.GetState()
	return s == messages.OperatorState_OPERATOR_STATE_DONE || s == messages.OperatorState_OPERATOR_STATE_FAILED
}

// follow waits for the status of r, calling onStatus with every new
// version of it, until its final one, which it returns. It fails when ctx
// ends (its cause), when r's node lifecycle ends first (errNodeEnded), or,
// with -timeout, a grace period after the request's deadline (errNoFinal).
func (c *ctl) follow(ctx context.Context, r *request, onStatus func(*messages.OperatorStatus)) (*messages.OperatorStatus, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if c.timeout > 0 {
		var stop context.CancelFunc
		ctx, stop = context.WithDeadlineCause(ctx, r.submitted.Add(c.timeout+c.grace), errNoFinal)
		defer stop()
	}
	go func() {
		t := time.NewTicker(c.liveEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if _, err := c.store.ReadNode(ctx, location.NodeKeyOf(r.node)); notFound(err) {
				cancel(errNodeEnded)
				return
			}
		}
	}()
	mesh, rid, id := r.node.GetMesh(), r.node.GetNodeRid(), r.req.GetId()
	var after location.StoreVersion
	for {
		st, v, err := operator.WatchStatus(ctx, c.board, mesh, rid, id, after)
		if err != nil {
			if ctx.Err() != nil {
				return nil, context.Cause(ctx)
			}
			if errors.Is(err, roamerr.ErrInvalidOperation) {
				return nil, err // a note roamctl cannot read: waiting will not mend it
			}
			select { // the store is unavailable: try again
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			case <-time.After(time.Second):
			}
			continue
		}
		after = v
		if onStatus != nil {
			onStatus(st)
		}
		if final(st) {
			return st, nil
		}
	}
}

// moveJSON is the outcome of `move --json`.
type moveJSON struct {
	RequestID string  `json:"request_id"`
	Kind      string  `json:"kind"`
	ID        string  `json:"id"`
	From      string  `json:"from"`
	FromRid   string  `json:"from_rid"`
	To        string  `json:"to"`
	ToRid     string  `json:"to_rid"`
	State     string  `json:"state"`
	PauseMs   float64 `json:"pause_ms"`
	Error     string  `json:"error,omitempty"`
	Code      string  `json:"code,omitempty"`
}

// Move asks the owner of id to move it to target (a live node's name, RID
// or address, in the owner's mesh) and waits for the outcome. kind ("" =
// whichever kind id names) picks among an Actor and a Spot of one ID.
func (c *ctl) Move(ctx context.Context, kind, id, target string) error {
	kinds := unitKinds
	if kind != "" {
		k, err := parseKind(kind)
		if err != nil {
			return err
		}
		if k == location.KindEntry {
			return failf(exitUsage, "an Entry Spot stays with its node: it cannot move")
		}
		kinds = []location.Kind{k}
	}
	rctx, cancel := c.readCtx(ctx)
	defer cancel()
	found, err := c.records(rctx, kinds, id)
	if err != nil {
		return err
	}
	switch len(found) {
	case 0:
		return failf(exitFailed, "%q: no %s of that ID (not found)", id, kindList(kinds))
	case 1:
	default:
		var ks []location.Kind
		for _, v := range found {
			ks = append(ks, v.Key.Kind)
		}
		return failf(exitUsage, "%q is the ID of an %s: give -kind", id, kindList(ks))
	}
	v := found[0]
	dir, err := c.directory(rctx, "")
	if err != nil {
		return err
	}
	owner := dir.owner(v.Record.GetOwner())
	if owner == nil {
		return failf(exitFailed, "%s: its owner %s has ended; a node takes it over on its next use", v.Key, v.Record.GetOwner().GetNodeRid())
	}
	mdir, err := c.directory(rctx, owner.GetMesh())
	if err != nil {
		return err
	}
	to, err := mdir.find(target)
	if err != nil {
		return err
	}
	if to.GetNodeRid() == owner.GetNodeRid() {
		fmt.Fprintf(c.out, "%s is on %s already\n", v.Key, nodeName(owner))
		return nil
	}
	r, err := c.submit(ctx, owner, func(req *messages.OperatorRequest) {
		req.Op = &messages.OperatorRequest_Move{Move: &messages.MoveOp{Kind: v.Key.Kind, Id: v.Key.ID, Target: to.GetNodeRid()}}
	})
	if err != nil {
		return err
	}
	if c.tty && !c.json {
		fmt.Fprintf(c.errOut, "moving %s: %s → %s (request %s)\n", v.Key, nodeName(owner), nodeName(to), r.req.GetId())
	}
	st, err := c.follow(ctx, r, nil)
	if err != nil {
		if errors.Is(err, errInterrupted) {
			fmt.Fprintf(c.errOut, "stopped waiting; the move of %s continues on %s (request %s)\n", v.Key, nodeName(owner), r.req.GetId())
			return &exitError{code: exitInterrupted}
		}
		return fmt.Errorf("move of %s (request %s on %s): %w", v.Key, r.req.GetId(), nodeName(owner), err)
	}
	out := moveJSON{
		RequestID: r.req.GetId(), Kind: location.KindName(v.Key.Kind), ID: v.Key.ID,
		From: nodeName(owner), FromRid: owner.GetNodeRid(), To: nodeName(to), ToRid: to.GetNodeRid(),
		State: operatorState(st.GetState()), PauseMs: ms(st.GetPauseP50Nanos()),
	}
	if st.GetState() == messages.OperatorState_OPERATOR_STATE_FAILED {
		out.Error, out.Code = failure(st)
		if c.json {
			_ = writeJSON(c.out, out)
		}
		return failf(exitFailed, "move of %s from %s to %s failed: %s (code %s)", v.Key, out.From, out.To, out.Error, out.Code)
	}
	// Where it landed, as the store has it now.
	lctx, lcancel := context.WithTimeout(ctx, 10*time.Second)
	defer lcancel()
	if now, err := c.store.Read(lctx, v.Key); err == nil {
		if d, err := c.directory(lctx, ""); err == nil {
			if n := d.owner(now.Record.GetOwner()); n != nil {
				out.To, out.ToRid = nodeName(n), n.GetNodeRid()
			}
		}
	}
	if c.json {
		return writeJSON(c.out, out)
	}
	fmt.Fprintf(c.out, "moved %s: %s → %s, pause %s\n", v.Key, out.From, out.To, dur(time.Duration(st.GetPauseP50Nanos())))
	return nil
}

// failure is why a request failed: its error, else its first unit's.
func failure(st *messages.OperatorStatus) (msg, code string) {
	msg, code = st.GetError(), st.GetCode()
	if msg == "" && len(st.GetFailures()) > 0 {
		msg, code = st.GetFailures()[0].GetError(), st.GetFailures()[0].GetCode()
	}
	if msg == "" {
		msg = "no reason given"
	}
	if code == "" {
		code = "-"
	}
	return msg, code
}

func operatorState(s messages.OperatorState) string {
	switch s {
	case messages.OperatorState_OPERATOR_STATE_RUNNING:
		return "RUNNING"
	case messages.OperatorState_OPERATOR_STATE_DONE:
		return "DONE"
	case messages.OperatorState_OPERATOR_STATE_FAILED:
		return "FAILED"
	}
	return "PENDING"
}

func kindList(kinds []location.Kind) string {
	s := ""
	for i, k := range kinds {
		switch {
		case i == 0:
		case i == len(kinds)-1:
			s += " or "
		default:
			s += ", "
		}
		s += location.KindName(k)
	}
	return s
}

// drainLine is one line of `drain --json`: every status as the node
// rewrites it, the last one with final set.
type drainLine struct {
	Node      string `json:"node"`
	NodeRid   string `json:"node_rid"`
	RequestID string `json:"request_id"`
	Final     bool   `json:"final"`
	Status    any    `json:"status"`
}

// Drain asks node (a live node's name, RID or address) to drain and
// follows its progress until the node reports the drain done or failed.
// Units that did not move make it fail (exit status 1). An interrupt
// stops the watching only; the drain goes on.
func (c *ctl) Drain(ctx context.Context, node string, concurrency uint32) error {
	rctx, cancel := c.readCtx(ctx)
	defer cancel()
	dir, err := c.directory(rctx, c.mesh)
	if err != nil {
		return err
	}
	n, err := dir.find(node)
	if err != nil {
		return err
	}
	name := nodeName(n)
	r, err := c.submit(rctx, n, func(req *messages.OperatorRequest) {
		req.Op = &messages.OperatorRequest_Drain{Drain: &messages.DrainOp{Concurrency: concurrency}}
	})
	if err != nil {
		return err
	}

	var (
		mu      sync.Mutex
		latest  *messages.OperatorStatus
		updated = make(chan struct{}, 1)
		done    = make(chan error, 1)
		last    *messages.OperatorStatus
	)
	go func() {
		st, err := c.follow(ctx, r, func(st *messages.OperatorStatus) {
			if c.json {
				_ = writeJSON(c.out, drainLine{Node: name, NodeRid: n.GetNodeRid(), RequestID: r.req.GetId(), Final: final(st), Status: statusJSON(st)})
			}
			mu.Lock()
			latest = st
			mu.Unlock()
			select {
			case updated <- struct{}{}:
			default:
			}
		})
		mu.Lock()
		if st != nil {
			latest = st
		}
		mu.Unlock()
		done <- err
	}()

	show := !c.json
	if show {
		fmt.Fprintf(c.out, "draining %s (request %s)\n", name, r.req.GetId())
	}
	line := &liveLine{w: c.out}
	every := c.tick
	if c.tty {
		every = c.tick / 4
	}
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	waiting := false
	draw := func() {
		mu.Lock()
		st := latest
		mu.Unlock()
		if !show {
			return
		}
		if st == nil {
			if c.tty {
				line.draw("waiting for " + name + " to take the request…")
			} else if !waiting {
				fmt.Fprintf(c.out, "%s waiting for %s to take the request\n", c.now().Format("15:04:05"), name)
			}
			waiting = true
			return
		}
		last = st
		p := progressOf(st, c.now().Sub(r.submitted))
		if c.tty {
			line.draw(p.bar())
		} else {
			fmt.Fprintf(c.out, "%s %s\n", c.now().Format("15:04:05"), p.counts())
		}
	}
	var ferr error
loop:
	for {
		select {
		case <-updated:
			if c.tty {
				draw()
			}
		case <-ticker.C:
			draw()
		case ferr = <-done:
			break loop
		}
	}
	mu.Lock()
	st := latest
	mu.Unlock()
	if show && c.tty && st != nil {
		line.draw(progressOf(st, c.now().Sub(r.submitted)).bar())
	} else if show && !c.tty && st != nil && st != last {
		fmt.Fprintf(c.out, "%s %s\n", c.now().Format("15:04:05"), progressOf(st, c.now().Sub(r.submitted)).counts())
	}
	line.end()
	if ferr != nil {
		if errors.Is(ferr, errInterrupted) {
			w := c.out
			if c.json {
				w = c.errOut
			}
			fmt.Fprintf(w, "stopped watching; the drain of %s continues on the node (request %s)\n", name, r.req.GetId())
			return &exitError{code: exitInterrupted}
		}
		return fmt.Errorf("drain of %s (request %s): %w", name, r.req.GetId(), ferr)
	}
	if show {
		c.drainSummary(name, st, c.now().Sub(r.submitted))
	}
	if st.GetState() == messages.OperatorState_OPERATOR_STATE_FAILED {
		msg, code := failure(st)
		return failf(exitFailed, "drain of %s failed: %s (code %s)", name, msg, code)
	}
	if st.GetFailed() > 0 {
		return failf(exitFailed, "drain of %s left %d unit(s) on it", name, st.GetFailed())
	}
	return nil
}

// drainSummary prints the outcome of a drain.
func (c *ctl) drainSummary(name string, st *messages.OperatorStatus, elapsed time.Duration) {
	took := elapsed
	if s, f := st.GetStartedUnixNanos(), st.GetFinishedUnixNanos(); s > 0 && f >= s {
		took = time.Duration(f - s)
	}
	fmt.Fprintf(c.out, "drain of %s %s in %s: %d moved, %d failed, of %d\n",
		name, operatorState(st.GetState()), dur(took), st.GetMoved(), st.GetFailed(), st.GetTotal())
	if st.GetMoved() > 0 {
		fmt.Fprintf(c.out, "pause p50 %s, p99 %s\n", dur(time.Duration(st.GetPauseP50Nanos())), dur(time.Duration(st.GetPauseP99Nanos())))
	}
	if st.GetError() != "" {
		fmt.Fprintf(c.out, "error: %s (code %s)\n", st.GetError(), st.GetCode())
	}
	if len(st.GetFailures()) > 0 {
		fmt.Fprintln(c.out, "failed units:")
		for _, f := range st.GetFailures() {
			fmt.Fprintf(c.out, "  %s: %s (code %s)\n", location.Key(f.GetKind(), f.GetId()), f.GetError(), f.GetCode())
		}
		if more := int(st.GetFailed()) - len(st.GetFailures()); more > 0 {
			fmt.Fprintf(c.out, "  … and %d more (the status lists the first %d)\n", more, len(st.GetFailures()))
		}
	}
}
