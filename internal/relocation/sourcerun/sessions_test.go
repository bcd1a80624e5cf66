package sourcerun

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/roamerr"
)

// sessionBound starts a move of a participant bound to the Session owned
// at g1: the seal request is out, nothing sealed yet.
func sessionBound(t *testing.T) (*Run[string, string], *fakeEnv) {
	t.Helper()
	r, env := newRun(t)
	env.owner = "g1"
	r.Step(handoff.Start{SessionBound: true})
	require.Equal(t, []string{"session seal"}, env.calls, "the Session owner is asked before the source seals")
	env.calls = nil
	return r, env
}

// The source seals only once its Session owner answered sealed, and only
// that owner's answer counts.
// Reference: docs/SESSIONS.md §2 (command 42).
func TestTheSourceSealsOnlyAfterItsSessionOwnersAnswer(t *testing.T) {
	r, env := sessionBound(t)
	r.SessionSealReply(0, "n9", nil)
	require.Empty(t, env.calls, "an answer from another node is ignored")
	r.SessionSealReply(0, "g1", nil)
	require.Equal(t, []string{"seal"}, env.calls)
	r.SessionSealReply(0, "g1", nil)
	require.Equal(t, []string{"seal"}, env.calls, "a duplicate answer changes nothing")
}

// NotFound: the Session owner has no such Session binding the Actor (it
// closed): the binding is dropped and the move goes on unbound.
// Reference: docs/SESSIONS.md §2.
func TestANotFoundAnswerDropsTheBindingAndTheMoveGoesOn(t *testing.T) {
	r, env := sessionBound(t)
	r.SessionSealReply(0, "g1", fmt.Errorf("%w: no Actor bound", roamerr.ErrNotFound))
	require.Equal(t, []string{"binding dropped", "seal"}, env.calls)
}

// Any other refusal ends the move before the source seals; nothing was
// installed at the owner, so no abort is sent to it.
// Reference: docs/SESSIONS.md §2.
func TestARefusalEndsTheMoveUnsealedWithoutAnAbort(t *testing.T) {
	r, env := sessionBound(t)
	r.SessionSealReply(0, "g1", fmt.Errorf("%w: sealed by another move", roamerr.ErrConflict))
	require.Equal(t, "complete (err true)", env.calls[0])
	require.NotContains(t, env.calls, "session abort")
	require.NotContains(t, env.calls, "seal")
}

// Silence past the seal wait: an owner whose node left the mesh has no
// Session behind the binding (dropped, the move goes on); one that may be
// alive ends the move, and its seal, which may be installed, is released.
// Reference: docs/SESSIONS.md §2.
func TestSilenceOfASessionOwner(t *testing.T) {
	t.Run("gone", func(t *testing.T) {
		r, env := sessionBound(t)
		env.gone = map[string]bool{"g1": true}
		r.Step(handoff.TimerFired{Timer: handoff.TimerSessionSeal})
		require.Equal(t, []string{"owners looked up: g1", "binding dropped", "seal"}, env.calls)
	})
	t.Run("alive", func(t *testing.T) {
		r, env := sessionBound(t)
		r.Step(handoff.TimerFired{Timer: handoff.TimerSessionSeal})
		require.Equal(t, []string{"owners looked up: g1", "session abort", "complete (err true)"}, env.calls[:3])
		n := len(env.calls)
		r.SessionSealReply(0, "g1", nil)
		require.Len(t, env.calls, n, "an answer after the abort is late")
	})
}

// A move that gave up while its participant's seal was still pending
// holds the Session abort until that seal took effect and was undone:
// the Session owner submits what it held behind the source's restored
// queue, never ahead of it.
// Reference: docs/SESSIONS.md §2 (command 44).
func TestTheSessionAbortWaitsForALateSealToBeUndone(t *testing.T) {
	r, env := sessionBound(t)
	r.SessionSealReply(0, "g1", nil)
	require.Equal(t, []string{"seal"}, env.calls)
	env.calls = nil

	r.Step(handoff.TimerFired{Timer: handoff.TimerSealPatience})
	require.NotContains(t, env.calls, "session abort", "the seal is still pending: the abort waits")

	env.post("m1")
	env.sealNow()
	require.Equal(t, []string{"unsealed", "session abort", "late seal undone (err <nil>)"}, env.calls[len(env.calls)-3:])
	require.Equal(t, []string{"m1"}, env.queue)
}
