package meshnode

import (
	crand "crypto/rand"
	"encoding/binary"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
)

// Proto.Actor names its futures (and every unnamed process) from one
// counter per actor system, "future$1", "future$2", …, and a future takes
// the first message that reaches it. Its remote waits on one of them when
// a node first talks to a peer, for its endpoint supervisor's answer: a
// peer spraying answers at the first numbers answered it first, the
// connect failed its type assertion, and when that connection was later
// reported lost the endpoint manager panicked the process. roam starts
// the counter at a random 62-bit number instead: the numbers can no
// longer be guessed from outside. A peer that was sent a request still
// sees its future's number and so the next ones; it could answer the
// next requests' futures, as with any Proto.Actor application (roam's own
// questions and calls use reply routes with 128 random bits, package
// ask). asynkron/protoactor-go#1233 makes the connect itself safe.
func unguessableIDs(sys *actor.ActorSystem) {
	var b [8]byte
	_, _ = crand.Read(b[:]) // never fails on a supported OS
	start := binary.LittleEndian.Uint64(b[:])>>2 | 1<<61
	reg := sys.ProcessRegistry
	for {
		cur := atomic.LoadUint64(&reg.SequenceID)
		if cur >= 1<<61 {
			return // started at random already (a system attached again)
		}
		if atomic.CompareAndSwapUint64(&reg.SequenceID, cur, start) {
			return
		}
	}
}
