package sourcerun

import (
	"errors"
	"fmt"

	"github.com/roamactors/roam/internal/machine/loglevel"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/roamerr"
)

// The source's side of bound Sessions (docs/SESSIONS.md §2): before it
// seals, the move asks each bound participant's Session owner to seal its
// binding (command 42); once the source serves again it tells every owner
// whose seal may be installed to release it (command 44). The machine
// bounds the wait for the answers (TimerSessionSeal, then
// LookUpSessionOwners).

// SessionSeal is where a participant's seal request stands.
type SessionSeal uint8

const (
	SessionUnasked SessionSeal = iota // not bound, not asked yet, or its binding dropped
	SessionAsked                      // 42 sent, no answer yet (a seal may be installed)
	SessionSealed                     // answered sealed
	SessionRefused                    // answered with a refusal: nothing installed
)

// sealSessions sends command 42 for every bound participant; none bound:
// sealed at once.
func (r *Run[M, R]) sealSessions() handoff.Event {
	r.sessionsAwaiting = 0
	for i, p := range r.Parts {
		if owner, _ := r.env.BoundTo(i); owner == "" {
			continue
		}
		p.Session = SessionAsked
		r.sessionsAwaiting++
		r.env.SendSessionSeal(i)
	}
	if r.sessionsAwaiting == 0 {
		return handoff.SessionsSealed{}
	}
	return nil
}

// SessionSealReply takes the answer to participant i's command 42 from
// the node at from (err: the owner's refusal, nil: sealed). Only the
// Session owner the binding names answers, once, while the move waits.
// NotFound means the owner has no such Session binding the Actor (closed,
// or its node started again since): the binding is dropped and the move
// goes on unbound. Any other refusal ends the wait unsealed.
func (r *Run[M, R]) SessionSealReply(i int, from string, err error) {
	if r.forgotten || r.env.Gone() || r.sessionsAwaiting == 0 || i < 0 || i >= len(r.Parts) {
		return // late, or a duplicate
	}
	p := r.Parts[i]
	owner, actor := r.env.BoundTo(i)
	if owner == "" || p.Session != SessionAsked {
		return
	}
	if from != owner {
		r.env.Log(handoff.Log{Level: loglevel.Warn, Event: "reply_from_wrong_peer", Msg: "seal reply ignored: not from the binding's Session owner"})
		return
	}
	switch {
	case errors.Is(err, roamerr.ErrNotFound):
		r.dropBinding(i, "the Session owner answered: "+err.Error())
		if r.sessionsAwaiting == 0 {
			r.Step(handoff.SessionsSealed{})
		}
	case err != nil:
		p.Session = SessionRefused
		r.sessionsAwaiting = 0
		r.Step(handoff.SessionsSealed{Err: fmt.Errorf("the Session owner refused to seal the binding of Actor %q: %w", actor, err)})
	default:
		p.Session = SessionSealed
		if r.sessionsAwaiting--; r.sessionsAwaiting == 0 {
			r.Step(handoff.SessionsSealed{})
		}
	}
}

// lookUpSessionOwners asks, once the seal wait ran out, which of the
// still silent Session owners' nodes are no live member any more.
func (r *Run[M, R]) lookUpSessionOwners() handoff.Event {
	var owners []string
	seen := map[string]bool{}
	for i, p := range r.Parts {
		if owner, _ := r.env.BoundTo(i); owner != "" && p.Session == SessionAsked && !seen[owner] {
			seen[owner] = true
			owners = append(owners, owner)
		}
	}
	gone, now := r.env.SessionOwnersGone(owners)
	if !now {
		return nil
	}
	return r.ownersLooked(gone)
}

// SessionOwnersLooked answers Env.SessionOwnersGone later: gone names the
// owners whose node is no live member.
func (r *Run[M, R]) SessionOwnersLooked(gone map[string]bool) {
	if r.forgotten || r.env.Gone() {
		return
	}
	if ev := r.ownersLooked(gone); ev != nil {
		r.Step(ev)
	}
}

// ownersLooked: silence from a Session owner whose node is no live member
// is a binding with no Session behind it (a node's Sessions end with its
// lifecycle), so the binding is dropped, not waited for; any other
// silence is the machine's to judge.
func (r *Run[M, R]) ownersLooked(gone map[string]bool) handoff.Event {
	if r.sessionsAwaiting == 0 {
		return nil // answered or aborted meanwhile
	}
	for i, p := range r.Parts {
		if owner, _ := r.env.BoundTo(i); owner != "" && p.Session == SessionAsked && gone[owner] {
			r.dropBinding(i, "its Session owner's node is no live member of the mesh")
		}
	}
	return handoff.SessionOwnersLooked{Silent: r.sessionsAwaiting > 0}
}

// dropBinding forgets participant i's Session binding: its Session is
// gone, so nothing holds or sends the client's messages for it, and a
// binding kept would make every later move of the Actor ask it in vain.
func (r *Run[M, R]) dropBinding(i int, why string) {
	r.env.DropBinding(i, why)
	r.Parts[i].Session = SessionUnasked
	r.sessionsAwaiting--
}

// abortSessions sends command 44 to the Session owner of every
// participant whose seal may be installed, once that participant's queue
// is back: a participant whose own seal is still pending is released when
// that seal is undone (UnsealLate), or the owner would submit what it
// held ahead of the messages the seal saved.
func (r *Run[M, R]) abortSessions() {
	r.sessionsAwaiting = 0 // no seal reply is awaited once the owners are told to release
	for i, p := range r.Parts {
		if owner, _ := r.env.BoundTo(i); owner == "" || p.Session == SessionUnasked || p.Session == SessionRefused {
			continue
		}
		if p.Sealed && !p.Captured {
			p.abortLater = true
			continue
		}
		r.env.SendSessionAbort(i)
	}
}
