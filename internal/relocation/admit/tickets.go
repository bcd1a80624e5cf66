// Package admit is the pure admission policy of a move's target (who may
// move an object onto a node, and what it may bring): the move tickets a
// capability answer hands out and a Restore request uses, the capability
// answer's verdict, and the admission of a cross-node Join and of a
// SpotWide Spot's members. Every input (the clock's time, the node's
// state, fresh ticket keys) is given; nothing here sends, reads the store
// or draws randomness itself.
//
// Anyone who reaches a node's port can send it a Restore request and
// declare any sender address (with mutual TLS only a certified host can;
// docs/SECURITY.md), and a request that names a real owner's fence would,
// if believed, rewrite the owner record. So a move is admitted in two
// steps:
//
//  1. The capability query names the asking node; it is answered only when
//     the store has that node, live, at the address the query came from,
//     and the answer, which carries a fresh single-use move ticket, goes to
//     that address. Whoever merely declares a member's address never sees
//     the ticket.
//  2. A Restore request must carry an unexpired ticket issued to its source
//     node and address, and before relay-ready the target reads the record:
//     the source must be the object's owner at the move's fence
//     (handoff.VerifySource) — or, before the seal, the source check that
//     carried the same ticket (CheckOnce, which does not use it up) read it.
//     A refusal names nothing the sender did not send.
package admit

import (
	"time"

	"github.com/roamactors/roam/messages"
)

// TicketTTL bounds how long a ticket waits for its Restore request: a
// source seals after the in-flight budget admits the move and after the
// object's current turn, which may be long.
const TicketTTL = 10 * time.Minute

// The tickets a node keeps: per source address at most TicketsPerSource
// (a source uses each within its move; a flood that claims a member's
// address only displaces that member's oldest), and at most MaxTickets in
// all (the oldest go first).
const (
	TicketsPerSource = 256
	MaxTickets       = 4096
)

// MaxTicketsPerAnswer bounds the tickets one capability answer carries
// (a query asks for its move's and spares for the moves after it), and
// MaxSparesPerSource the spare tickets one source address holds.
const (
	MaxTicketsPerAnswer = 16
	MaxSparesPerSource  = 128
)

// ticket is what a ticket admits.
type ticket struct {
	rid        string
	generation uint64
	address    string
	expires    time.Time
	spare      bool // a spare ticket (counted in spares, not in bySource)
	// checked: a source check carried it (CheckOnce): one per ticket, so
	// a ticket cannot be made to read the store again and again.
	checked bool
}

// Tickets are the move tickets a node issued and no Restore request has
// used yet, in issue order (their expiries are in the same order).
type Tickets struct {
	// newKey is a fresh unguessable key for each ticket.
	newKey   func() string
	byKey    map[string]ticket
	order    []string            // keys, oldest first; used or evicted keys stay until popped
	bySource map[string][]string // the keys of move tickets per source address, oldest first
	// spares counts the spare tickets per source address. They are never
	// displaced (a move under way may hold one): past MaxSparesPerSource
	// a source gets no more until it uses or gives back some.
	spares map[string]int
}

// NewTickets keeps tickets under the keys newKey gives (fresh and
// unguessable: a ticket is what admits a move).
func NewTickets(newKey func() string) *Tickets {
	return &Tickets{newKey: newKey, byKey: map[string]ticket{}, bySource: map[string][]string{}, spares: map[string]int{}}
}

// Answer is the tickets of a capability answer to q, asked at now by the
// source node src from address, once the answer's verdict is known
// (supported) on a node of capacity capacity: the spare tickets q gives
// back are forgotten first (their answer grew old, or the target refused
// a move). A supported move gets a ticket, unless q asks for the load
// only: a drain asking starts no move, and a ticket would displace those
// of moves under way. Spares only on a node without capacity: one with a
// capacity answers each move by its load at the time.
func (ts *Tickets) Answer(q *messages.CapabilityQuery, address string, supported bool, capacity uint32, now time.Time) (move []byte, spares [][]byte) {
	ts.GiveBack(address, q.GetReturnedTickets())
	if !supported || q.GetWantLoad() {
		return nil, nil
	}
	src := q.GetSource()
	move = ts.Issue(src.GetNodeRid(), src.GetNodeGeneration(), address, now)
	if capacity != 0 {
		return move, nil
	}
	for n := min(int(q.GetWantTickets()), MaxTicketsPerAnswer) - 1; n > 0; n-- {
		t := ts.IssueSpare(src.GetNodeRid(), src.GetNodeGeneration(), address, now)
		if t == nil {
			break
		}
		spares = append(spares, t)
	}
	return move, spares
}

// Issue gives a move ticket to the source node rid at address; the oldest
// of that address's move tickets makes room past TicketsPerSource.
func (ts *Tickets) Issue(rid string, generation uint64, address string, now time.Time) []byte {
	if q := ts.bySource[address]; len(q) >= TicketsPerSource {
		ts.remove(q[0])
	}
	key := ts.add(ticket{rid: rid, generation: generation, address: address, expires: now.Add(TicketTTL)}, now)
	ts.bySource[address] = append(ts.bySource[address], key)
	return []byte(key)
}

// IssueSpare gives a spare ticket, or nil when address holds
// MaxSparesPerSource of them.
func (ts *Tickets) IssueSpare(rid string, generation uint64, address string, now time.Time) []byte {
	if ts.spares[address] >= MaxSparesPerSource {
		return nil
	}
	key := ts.add(ticket{rid: rid, generation: generation, address: address, expires: now.Add(TicketTTL), spare: true}, now)
	ts.spares[address]++
	return []byte(key)
}

// Spares is how many spare tickets the source at address holds.
func (ts *Tickets) Spares(address string) int { return ts.spares[address] }

// GiveBack forgets the tickets a source at address says it will not use
// (only its own).
func (ts *Tickets) GiveBack(address string, keys [][]byte) {
	for _, k := range keys {
		if t, ok := ts.byKey[string(k)]; ok && t.address == address {
			ts.remove(string(k))
		}
	}
}

// add keeps t under a fresh key, after dropping expired tickets and (past
// MaxTickets) the oldest.
func (ts *Tickets) add(t ticket, now time.Time) string {
	for len(ts.order) > 0 {
		t, live := ts.byKey[ts.order[0]]
		if live && now.Before(t.expires) && len(ts.byKey) < MaxTickets {
			break
		}
		ts.remove(ts.order[0])
		ts.order = ts.order[1:]
	}
	if len(ts.order) > 2*len(ts.byKey)+64 {
		// Keys removed out of order pile up behind a live head: compact
		// (amortized O(1) per issue).
		live := ts.order[:0]
		for _, k := range ts.order {
			if _, ok := ts.byKey[k]; ok {
				live = append(live, k)
			}
		}
		ts.order = live
	}
	key := ts.newKey()
	ts.byKey[key] = t
	ts.order = append(ts.order, key)
	return key
}

// remove forgets a ticket (once: a removed key is ignored).
func (ts *Tickets) remove(key string) {
	t, ok := ts.byKey[key]
	if !ok {
		return
	}
	delete(ts.byKey, key)
	if t.spare {
		if ts.spares[t.address]--; ts.spares[t.address] <= 0 {
			delete(ts.spares, t.address)
		}
		return
	}
	q := ts.bySource[t.address]
	for i, k := range q {
		if k == key {
			q = append(q[:i:i], q[i+1:]...)
			break
		}
	}
	if len(q) == 0 {
		delete(ts.bySource, t.address)
	} else {
		ts.bySource[t.address] = q
	}
}

// Take consumes the ticket of a Restore request p that came from address
// at now; false when there is none for that source node, address and
// fence.
func (ts *Tickets) Take(p *messages.RelocationPrepare, address string, now time.Time) bool {
	key := string(p.GetMoveTicket())
	if !ts.admits(key, p.GetSource(), p.GetIdentity().GetCoordinatorFence(), address, now) {
		return false
	}
	ts.remove(key)
	return true
}

// CheckOnce reports whether the source check q that came from address at
// now carries an unexpired ticket issued to its source node and address,
// for a move of that node's fence, that no source check carried before.
// It does not use the ticket up (the Restore request that follows the
// check does), but a second check with it is refused: each check reads
// the store, and a ticket admits one move.
func (ts *Tickets) CheckOnce(q *messages.SourceCheck, address string, now time.Time) bool {
	key := string(q.GetMoveTicket())
	if !ts.admits(key, q.GetSource(), q.GetIdentity().GetCoordinatorFence(), address, now) || ts.byKey[key].checked {
		return false
	}
	t := ts.byKey[key]
	t.checked = true
	ts.byKey[key] = t
	return true
}

// admits: the ticket under key admits a move of src's, with fence, from
// address, at now.
func (ts *Tickets) admits(key string, src *messages.NodeRef, fence *messages.CoordinatorFence, address string, now time.Time) bool {
	t, ok := ts.byKey[key]
	if !ok || now.After(t.expires) {
		return false
	}
	return t.address == address && t.rid == src.GetNodeRid() && t.generation == src.GetNodeGeneration() &&
		fence.GetNodeRid() == t.rid && fence.GetNodeGeneration() == t.generation
}
