// Package liveness is the one rule by which a node takes another node
// lifecycle for ended (docs/FAULTS.md, "Lease fencing"): a pure record of
// what this node saw of the others' descriptors and when, on its own
// monotonic clock, given as input. No goroutines, clock or network; the
// relocation driver feeds it every descriptor read, and revokes the lease
// of a lifecycle it judges Silent.
//
// The argument: a lifecycle's holder renews its lease every TTL/3, and a
// renewal succeeds only once it changed the descriptor's version (the
// heartbeat, location.Store.RenewLease). A holder counts itself the owner
// only until the send time of its last successful renewal + TTL − margin.
// That renewal's version change was applied after it was sent, so before
// any node saw that version. A node that has seen one version stand still
// for a TTL on its own clock, from its first sight of it, therefore knows
// the holder fenced itself (the margin covers clock-rate drift). It then
// revokes the lease at that version — a compare-and-set, so a renewal that
// landed meanwhile wins — and the holder, whose next renewal finds the
// lease gone, can never unfence. A descriptor that disappeared without
// this node having watched it silent (the store ended the lease, possibly
// early: Consul destroys a session when its agent's node leaves) is taken
// for ended a TTL after this node first saw it missing: the holder's last
// renewal was applied before the descriptor went.
package liveness

import "time"

// Verdict is what a node may conclude about another lifecycle now.
type Verdict int

const (
	// Alive: the lifecycle's holder may serve.
	Alive Verdict = iota
	// Silent: its descriptor has stood still for a TTL: the holder has
	// fenced itself. Revoke its lease at the version seen; then it ended.
	Silent
	// Ending: its descriptor is gone, seen gone for less than a TTL: not
	// yet provably fenced.
	Ending
	// Ended: provably fenced, and its lease gone: its objects are an ended
	// owner's.
	Ended
)

func (v Verdict) String() string {
	return [...]string{"alive", "silent", "ending", "ended"}[v]
}

// Watch is one node's record of the other lifecycles it saw.
type Watch struct {
	// TTL is the lease TTL assumed for a lifecycle whose descriptor does
	// not name its own (and for one never seen present).
	TTL   time.Duration
	beats map[string]beat
	gone  map[string]time.Duration
}

// beat is a lifecycle's descriptor version as first seen.
type beat struct {
	version uint64
	since   time.Duration // first sight of version
	ttl     time.Duration
}

// New returns an empty Watch assuming ttl.
func New(ttl time.Duration) *Watch {
	return &Watch{TTL: ttl, beats: map[string]beat{}, gone: map[string]time.Duration{}}
}

// Seen records that lifecycle id's descriptor is at version at now (a
// monotonic instant), its lease's TTL ttl (0: Watch.TTL), and judges it:
// Alive, or Silent once that version has stood still for a TTL.
func (w *Watch) Seen(id string, version uint64, ttl time.Duration, now time.Duration) Verdict {
	ttl = max(ttl, w.TTL)
	delete(w.gone, id)
	b, ok := w.beats[id]
	if !ok || b.version != version {
		w.beats[id] = beat{version: version, since: now, ttl: ttl}
		return Alive
	}
	if now-b.since >= b.ttl {
		return Silent
	}
	return Alive
}

// Revoked records that the lease of id was revoked (by this node, or it
// went) after this node had judged it Silent: it ended.
func (w *Watch) Revoked(id string, now time.Duration) {
	w.gone[id] = now - w.ttlOf(id) // counts as gone for a TTL already
}

// Missing records that lifecycle id's descriptor is gone at now and judges
// it: Ended when this node revoked its lease, or has seen it gone for a
// TTL; else Ending, with how long it has been seen gone. The TTL is the
// longest of ttl (what a record says of the owner's lease; 0 if nothing),
// the one its descriptor said when seen, and Watch.TTL: a node that never
// saw the descriptor must not judge a longer lease by its own. That this
// node last saw a version stand still for a TTL proves nothing here: the
// holder may have renewed after that look, unseen, and the store ended its
// lease early since.
func (w *Watch) Missing(id string, ttl, now time.Duration) (Verdict, time.Duration) {
	first, ok := w.gone[id]
	if !ok {
		first = now
		w.gone[id] = now
	}
	if now-first >= max(ttl, w.ttlOf(id)) {
		return Ended, now - first
	}
	return Ending, now - first
}

func (w *Watch) ttlOf(id string) time.Duration {
	if b, ok := w.beats[id]; ok {
		return b.ttl
	}
	return w.TTL
}

// Forget drops what was seen of lifecycles not seen since before, to bound
// the record (forgetting only makes a later look wait a TTL again).
func (w *Watch) Forget(before time.Duration) {
	for id, b := range w.beats {
		if b.since < before {
			delete(w.beats, id)
		}
	}
	for id, t := range w.gone {
		if t < before {
			delete(w.gone, id)
		}
	}
}
