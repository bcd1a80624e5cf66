package consulstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/location"
)

// Group commit (docs/CONSUL.md, "Batching"). Every Consul request costs
// an HTTP round trip and, for a write, a Raft entry, whatever it carries;
// a drain makes thousands a second, most of them one-key reads and
// compare-and-sets. So concurrent calls of one kind share transactions:
// a call made while maxInFlight transactions of its kind are on their way
// waits, and those waiting go together in the next one. An idle store
// adds no wait; the busier it is, the more each transaction carries.
//
// Combining never changes what a call means:
//   - a write transaction is atomic, so calls sent together apply
//     together or not at all; their keys are disjoint (no call can see
//     another's write inside the transaction);
//   - when Consul rolls a combined transaction back, the calls whose own
//     operations failed get that answer, and the others are sent again:
//     nothing of them applied;
//   - an answer that may have applied (a cut connection, a timeout) goes
//     to every call in the transaction, as it would have alone;
//   - a refusal that may concern one call only (the ACL token, the size)
//     sends each call of the transaction again on its own;
//   - a call whose caller has stopped waiting is never sent again.

// maxInFlight is how many transactions of one kind (reads, writes) a
// Store has on their way at once while they make progress.
const maxInFlight = 1

// A transaction with no answer for stallAfter (a connection that leads
// nowhere, a hung agent) must not hold up every other call of the Store:
// a call that waited that long without any transaction of its kind
// starting or ending starts another one, up to maxStalled in all.
const (
	stallAfter = 500 * time.Millisecond
	maxStalled = 8
)

// maxBatchBytes bounds the values one combined write transaction carries
// (Consul refuses a transaction above txn_max_req_len, 512 KiB by
// default, and JSON grows values by a third).
const maxBatchBytes = 256 << 10

// batchPatience bounds a combined transaction when one of its callers set
// no deadline.
const batchPatience = 30 * time.Second

// txnCall is one caller's operations waiting for, or in, a transaction.
type txnCall struct {
	ctx   context.Context
	ops   api.TxnOps
	keys  []string // the keys the ops touch (writes only)
	size  int
	alone bool // send in a transaction of its own
	// taken: in a transaction on its way; left: the caller stopped
	// waiting (never sent again). Both under the batcher's mu.
	taken, left bool
	done        chan txnAnswer // one answer
}

// txnAnswer is a call's share of a transaction's answer: the whole
// response (a call finds its own keys in it), the indexes of its own ops
// that failed when Consul rolled the transaction back, or an error.
type txnAnswer struct {
	resp   *api.TxnResponse
	failed []int
	err    error
	// alone: the error may concern one call only, or says too little;
	// each call of a combined transaction is sent again on its own.
	alone bool
}

// batcher combines the concurrent calls of one kind.
type batcher struct {
	what string
	send func(ctx context.Context, ops api.TxnOps) txnAnswer // one transaction
	// write: keys must be disjoint, and a rollback is split by op.
	write bool

	// calls and txns count what was sent (tests).
	calls, txns atomic.Int64

	mu       sync.Mutex
	inFlight int
	queue    []*txnCall
	// progress: when a transaction of this kind last started or ended.
	progress time.Time
}

// do runs ops in a transaction, alone or with other calls', and returns
// the call's answer.
func (b *batcher) do(ctx context.Context, ops api.TxnOps, keys []string, size int) txnAnswer {
	if err := ctxUnavailable(ctx, b.what); err != nil {
		return txnAnswer{err: err}
	}
	c := &txnCall{ctx: ctx, ops: ops, keys: keys, size: size, alone: size > maxBatchBytes || len(ops) > location.MaxApplyOps, done: make(chan txnAnswer, 1)}
	b.mu.Lock()
	if b.inFlight < maxInFlight && len(b.queue) == 0 {
		return b.direct(c)
	}
	b.queue = append(b.queue, c)
	if b.inFlight < maxInFlight {
		b.inFlight++
		machine.Go(b.run)
	}
	b.mu.Unlock()
	stall := time.NewTimer(stallAfter)
	defer stall.Stop()
	for {
		select {
		case a := <-c.done:
			return a
		case <-stall.C:
			b.unstall(c)
			stall.Reset(stallAfter)
		case <-ctx.Done():
			return b.leave(ctx, c)
		}
	}
}

// direct sends c's transaction on the caller's goroutine: nothing waits
// and nothing is on its way, so there is nothing to combine it with, and
// a goroutine started to send it and the hand-back of its answer would
// cost two scheduler wake-ups, each up to a few hundred µs on a machine
// that was idle — as much as the round trip to a local agent. Calls made
// meanwhile queue as usual; c's transaction ending hands them the slot.
// Called with b.mu held; returns with it released.
func (b *batcher) direct(c *txnCall) txnAnswer {
	b.inFlight++
	c.taken = true
	b.progress = time.Now()
	b.mu.Unlock()
	b.sendBatch([]*txnCall{c})
	b.mu.Lock()
	b.progress = time.Now()
	if len(b.queue) > 0 {
		machine.Go(b.run) // the slot passes on to the calls that queued
	} else {
		b.inFlight--
	}
	b.mu.Unlock()
	return <-c.done
}

// unstall starts one more transaction for c's kind if c still waits and
// none started or ended for stallAfter.
func (b *batcher) unstall(c *txnCall) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !c.taken && b.inFlight < maxStalled && time.Since(b.progress) >= stallAfter {
		b.inFlight++
		b.progress = time.Now()
		machine.Go(b.run)
	}
}

// leave is the answer of a call whose caller stopped waiting.
func (b *batcher) leave(ctx context.Context, c *txnCall) txnAnswer {
	b.mu.Lock()
	c.left = true
	taken := c.taken
	b.mu.Unlock()
	select {
	case a := <-c.done: // answered meanwhile
		return a
	default:
	}
	if !taken {
		return txnAnswer{err: ctxUnavailable(ctx, b.what)}
	}
	// On its way: it may apply (classify: a write cut after sending).
	return txnAnswer{err: classify(b.what, ctx.Err(), b.write)}
}

// run sends transactions while calls wait, then gives its slot back.
func (b *batcher) run() {
	for {
		b.mu.Lock()
		batch := b.takeLocked()
		if len(batch) == 0 {
			b.inFlight--
			b.mu.Unlock()
			return
		}
		b.progress = time.Now()
		b.mu.Unlock()
		b.sendBatch(batch)
		b.mu.Lock()
		b.progress = time.Now()
		b.mu.Unlock()
	}
}

// takeLocked takes the next transaction's calls off the queue, in order:
// those that fit (operations, bytes) and, for writes, touch no key of a
// call already taken. Calls whose caller left are dropped unsent.
func (b *batcher) takeLocked() []*txnCall {
	var batch []*txnCall
	var ops, size int
	keys := map[string]bool{}
	rest := b.queue[:0]
	for _, c := range b.queue {
		if c.left || c.ctx.Err() != nil {
			c.done <- txnAnswer{err: ctxUnavailable(c.ctx, b.what)}
			continue
		}
		fits := len(batch) == 0 || !c.alone && !batch[0].alone && ops+len(c.ops) <= location.MaxApplyOps && size+c.size <= maxBatchBytes
		if fits && b.write {
			for _, k := range c.keys {
				if keys[k] {
					fits = false
					break
				}
			}
		}
		if !fits {
			rest = append(rest, c)
			continue
		}
		batch = append(batch, c)
		ops, size = ops+len(c.ops), size+c.size
		for _, k := range c.keys {
			keys[k] = true
		}
		c.taken = true
	}
	clear(b.queue[len(rest):])
	b.queue = rest
	return batch
}

// sendBatch sends one transaction for batch and answers its calls (or
// puts them back at the front of the queue, see the rules above).
func (b *batcher) sendBatch(batch []*txnCall) {
	b.calls.Add(int64(len(batch)))
	b.txns.Add(1)
	if len(batch) == 1 {
		batch[0].done <- b.send(batch[0].ctx, batch[0].ops)
		return
	}
	ctx, cancel := batchContext(batch)
	defer cancel()
	var ops api.TxnOps
	offsets := make([]int, len(batch))
	for i, c := range batch {
		offsets[i] = len(ops)
		ops = append(ops, c.ops...)
	}
	a := b.send(ctx, ops)
	var again []*txnCall
	switch {
	case a.err != nil && (a.alone || alonePerhaps(a.err)):
		for _, c := range batch {
			c.alone = true
		}
		again = batch
	case a.err != nil || a.failed == nil:
		for _, c := range batch {
			c.done <- a
		}
	case len(a.failed) == 0:
		// Rolled back without saying which op failed: each on its own.
		for _, c := range batch {
			c.alone = true
		}
		again = batch
	default:
		for i, c := range batch {
			var own []int
			for _, f := range a.failed {
				if f >= offsets[i] && f < offsets[i]+len(c.ops) {
					own = append(own, f-offsets[i])
				}
			}
			if own != nil {
				c.done <- txnAnswer{failed: own}
			} else {
				again = append(again, c) // nothing of it applied
			}
		}
	}
	if len(again) > 0 {
		b.mu.Lock()
		for _, c := range again {
			c.taken = false
		}
		b.queue = append(again, b.queue...)
		b.mu.Unlock()
	}
}

// alonePerhaps reports a refusal of a combined transaction that may
// concern one of its calls only.
func alonePerhaps(err error) bool {
	return errors.Is(err, location.ErrPermissionDenied) || errors.Is(err, location.ErrTooLarge) || errors.Is(err, location.ErrInvalid)
}

// batchContext bounds a combined transaction by its callers' latest
// deadline (batchPatience when one has none); a caller that leaves does
// not cut the others' transaction.
func batchContext(batch []*txnCall) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, c := range batch {
		dl, ok := c.ctx.Deadline()
		if !ok {
			dl = time.Now().Add(batchPatience)
		}
		if dl.After(latest) {
			latest = dl
		}
	}
	return context.WithDeadline(context.WithoutCancel(batch[0].ctx), latest)
}

// readBatched reads key consistently, in a read transaction shared with
// other concurrent reads.
func (s *Store) readBatched(ctx context.Context, key string) (*api.KVPair, error) {
	a := s.reads.do(ctx, api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVGetOrEmpty, Key: key}}}, nil, 0)
	if a.err != nil {
		return nil, a.err
	}
	for _, r := range a.resp.Results {
		if r.KV != nil && r.KV.Key == key {
			if r.KV.ModifyIndex == 0 {
				return nil, nil
			}
			return r.KV, nil
		}
	}
	return nil, fmt.Errorf("%w: read %s: consul hid the key: the ACL token may not read it", location.ErrPermissionDenied, key)
}

// sendRead sends one consistent read: a key read for one op, else a
// read-only transaction.
func (s *Store) sendRead(ctx context.Context, ops api.TxnOps) txnAnswer {
	if len(ops) == 1 {
		key := ops[0].KV.Key
		var pair *api.KVPair
		err := s.on(ctx, readCall, func(ctx context.Context, c *api.Client) (err error) {
			pair, _, err = c.KV().Get(key, s.consistent(ctx))
			return err
		})
		if err != nil {
			return txnAnswer{err: classify("read", err, false)}
		}
		if pair == nil {
			pair = &api.KVPair{Key: key}
		}
		return txnAnswer{resp: &api.TxnResponse{Results: api.TxnResults{{KV: pair}}}}
	}
	var ok bool
	var resp *api.TxnResponse
	err := s.on(ctx, readCall, func(ctx context.Context, c *api.Client) (err error) {
		ok, resp, _, err = c.Txn().Txn(ops, s.consistent(ctx))
		return err
	})
	if err != nil {
		// Consul's client folds every HTTP status of a transaction into
		// one message: alone, each read is a plain key read, whose
		// failure it reports precisely. A failure without an answer
		// (timeout, cut connection) is every read's.
		return txnAnswer{err: classify("read", err, false), alone: answered(err)}
	}
	if !ok {
		if denied := deniedOps(resp); denied != "" {
			return txnAnswer{err: fmt.Errorf("%w: read: consul refused the ACL token: %s", location.ErrPermissionDenied, denied)}
		}
		return txnAnswer{err: fmt.Errorf("%w: read transaction failed: %v", location.ErrUnavailable, txnErrors(resp))}
	}
	// Every get-or-empty answers, present or not; Consul leaves out
	// silently those the token may not read.
	if len(resp.Results) != len(ops) {
		return txnAnswer{err: fmt.Errorf("%w: read: consul hid %d of %d keys: the ACL token may not read them", location.ErrPermissionDenied, len(ops)-len(resp.Results), len(ops))}
	}
	return txnAnswer{resp: resp}
}

// sendWrite sends one write transaction.
func (s *Store) sendWrite(ctx context.Context, ops api.TxnOps) txnAnswer {
	resp, failed, err := s.writeTxn(ctx, "apply", ops)
	return txnAnswer{resp: resp, failed: failed, err: err}
}

// answered reports an error of Consul's client that carries an HTTP
// answer it did not classify (its transaction call's).
func answered(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "Failed request") || strings.Contains(msg, "Unexpected response code")
}
