// Package sim is the deterministic simulation of an Instance Spot's
// lifecycle per Spot ID as roam composes it: the pure machines of
// internal/activation (Activation with its recovery and resumption,
// the Write that settles an indeterminate answer, Clear, Release) driven
// by spot's own effect interpreter, on three nodes, against a
// store model of the Spot authority records, with clients that call Spots
// by ID — all on one logical clock, every choice drawn from one PCG seed,
// so a seed replays a schedule step for step (make sim-spot SEED=<n>
// prints its trace). It follows internal/relocation/sim, which does the
// same for the hand-off.
//
// What it models, and where each rule comes from:
//
//   - The runner: not modelled. Each machine runs on the driver's own
//     interpreter, internal/activation/activationrun (the order of its
//     effects, its answers and timers, each call's deadline, what it gives
//     back on Finish); machineenv.go supplies this world's primitives,
//     with the operation's deadline being the activation's deadline, a
//     Clear's ClearFor, a Release's ReleaseFor or the scan's minute, and a
//     timeout of its own being Config.CallTimeout.
//   - The Spot service (manager.go, activate.go, closeself.go), whose
//     decisions and orderings are the driver's own code
//     (internal/activation/spotservice): SpotActivations (number 39 in
//     docs/PROTOCOL.md §8, hence cmd39 in the names here) queue per Spot
//     ID and run one at a time in arrival order (Queues); the Spot ID's
//     lock is FIFO (Locks); a full node passes the envelope on to the
//     first candidate that has not refused it (PassOn); shared watches
//     per key and version with a 10 s store watch (Watches); the
//     start-up scan (Scan: each kind's records, in one page here, and of
//     them only those needing recovery) when a lifecycle starts; an
//     Instance Spot's own close (CloseSelf: under the Spot
//     ID's lock, the Closing write by a Write machine alone, read again
//     on a lost race, then the Release machine); whether a creation is
//     admitted (AdmitCapacity: serving incarnations plus creations in
//     progress within a node's capacity). A Spot ID's authority is
//     resolved by the driver's own spotcall.Resolve (both Spot keys read
//     at once, then the owner's liveness). The owner's liveness and the
//     heartbeat watch are the relocation driver's own interpreter,
//     internal/relocation/releaserun (Driver.OwnerNode, WatchNodes: a
//     descriptor watched standing still for a TTL is revoked at its
//     version, one gone is ended once revoked or once seen gone for a
//     TTL), over this lifecycle's store calls and liveness watch
//     (client.go ownerEnv). Modelled here still: the recovery pointer's
//     removal started by the first handler's return (Staged.Open's
//     afterFirst); the listing every watchEvery that feeds the watch; the
//     liveness looks of the extension's recovery passes (ownerLooks: at
//     start and after a lifecycle left the listing; their recoveries are
//     not modelled).
//   - Callers: not modelled where call.go decides. The way a call goes
//     (a Ready owner directly, a Missing Spot placed, an ended owner's or
//     abandoned record reactivated, a Creating or Closing record to its
//     owner), the placement (Mesh, type, weighted rendezvous order of the
//     Spot ID), the SpotActivation's fields and what each end of a wait
//     means (its class, whether the route is dropped) are the driver's
//     own, internal/spot/spotcall. Modelled here (client.go): a client
//     lives on a node and calls through its node's current lifecycle,
//     one call after the other (a send returns at outbound admission, or,
//     sent in a command 39, on its dispatch notice or a failure; a
//     request with its reply or a failure); the positive route cache's
//     storage, its policy being the driver's (spotcall.RoutePolicy: Ready
//     with a live owner, RouteCacheMaxAge, swept every second against
//     the live descriptors' leases; dropped as spotcall.Ended and Refused
//     say, a lost connection included; a route whose connection ended
//     checked as spotcall.RouteLost says, the connection ended only by a
//     gone process; a resolve put as spotcall.RoutePolicy.Put says); not
//     cache.go's drain barrier (a RouteBarrier down an old route: no moves
//     or drains here; a resolve that would drain another incarnation's
//     route drops it and reads again);
//     the events a request's wait ends on (its deadline, the connection to
//     the node it went to, the owner's liveness every second).
//   - Nodes: a node is a sequence of lifecycles (cluster.Node, new node
//     RID, generation, lease and address each); the owner lease is the
//     node's own keeper (internal/meshnode/lease), stepped with the
//     world's renewal answers and clock as cluster.Node's lease loop steps
//     it: renewals every RenewEvery, retries every RetryEvery, a lifecycle
//     fenced at its last proven renewal's send time + TTL − margin (no
//     dispatch, no write: location.Leased refuses locally), unfenced only
//     by a confirmed renewal, and
//     ended when a renewal finds the lease gone (its serving incarnations
//     fail what they hold and what reaches them, Driver.endOwned; its
//     machines finish on their own; its process goes after Linger); a
//     crash ends the process at once (everything in memory is lost); either
//     way the node comes back as a new lifecycle after a delay and runs the
//     start-up scan.
//   - Incarnations, minimally (relocation host.go, object.go): staged
//     (Driver.Stage: what reaches its PID waits; a PID in use is refused),
//     open (Staged.Open: the first messages at the head of the queue,
//     ahead of what waited; a lifecycle already ended ends it at once),
//     handled one at a time in queue order while the lease is provably
//     valid and no recovery pointer's removal is pending after the first
//     message (mailbox.Gate), a send's dispatch notice answered as it is
//     dispatched, a request dispatched more than 1 s past its deadline
//     answered DeadlineExceeded and not run (host.Receive, which runs the
//     afterFirst hook all the same), discarded (Staged.Discard: waiting
//     requests answered Unavailable, waiting sends failed loudly), closed
//     (Driver.CloseLocal: a marker behind what it accepted, a stale answer
//     for what is behind it, then dead letters); each records what it
//     handled. Dead letters (redeliver.go): a request gets ErrStale; what
//     becomes of a send is the driver's redelivery policy
//     (redelivery.Policy.DeadLettered: at once, held behind a growing
//     pause, or failed loudly past the patience), its owner looked up by
//     the driver's redelivery.Lookup (the record whatever its state, its
//     owner's node), looked up again as redelivery.ResolveAgain paces it
//     within the window, and a batch delivered, failed or abandoned as
//     redelivery.Batch says; what waits fails loudly once the lifecycle
//     ended. Modelled: the per-Spot queue and its one worker.
//   - Store (location.Store, location.RootStore): records under the
//     Instance and User Spot keys with one store-wide version; Apply with
//     create-if-absent, update and delete on a version, and the check that
//     the other Spot kind's key is absent (the reservation's transaction);
//     every node write carries the writer's lease check (ErrLeaseEnded
//     once the store ended its lease); per-lifecycle leases that end
//     LeaseTTL after the last renewal the store applied, taking the node
//     descriptor with them; node descriptors and their listing; a watch;
//     recovery roots (put, get, delete). Every call is answered ok,
//     conflict (a precondition), unavailable, indeterminate after applying
//     (writes), indeterminate without applying, or slow (applied late,
//     answered late, possibly after the caller's context ended); outages
//     for every node or for one.
//   - Network: each direction between two lifecycles is a FIFO stream with
//     random delays; links between nodes are cut in one or both
//     directions (what is in flight is lost, sends meanwhile are dropped,
//     the sender learns it and its waiting requests fail Unavailable);
//     packets are slow; a SpotActivation may be dropped with its connection;
//     a send to a lifecycle known gone is a dead letter at the sender.
//
// Timings are roam's scaled down (DefaultConfig): a 1 s call deadline, a
// 3 s lease TTL with a 600 ms margin, ReleaseFor and the redelivery bounds
// the same multiples of the TTL as in roam (30 s, 10 s and 30 s against a
// 10 s TTL), ClearFor beyond any fault of a schedule (roam's 10 min is
// beyond any store trouble a lease survives), and the machines'
// AbandonGrace (5 s) as it is; the dead-letter back-off is roam's
// (50 ms doubling to 2 s). Faults and traffic stop at the
// horizon; after every deadline plus AbandonGrace one probe request per
// Spot ID checks that the Spot serves again (PROTOCOL.md §7.7, §7.10).
//
// Not modelled: moves (the hand-off is internal/relocation/sim's), so no
// Message Follow, route hints or barriers; User Spots (only their key,
// which every reservation checks absent); ReleaseEnded; RecoverEnded's
// recoveries (only its looks at owners, ownerLooks); a graceful Stop;
// the two renewals in a row that lift a fence (one suffices against this
// store, which never answers a renewal while ending the lease); clock
// skew between nodes; a node with several Meshes or kinds it does not
// host; payload sizes, the factory and the application's state (an
// incarnation's state is the list of messages it handled).
//
// The invariants are listed in check.go. The defects the simulation
// found are listed in known.go's defects table, each with its seed.
// A fixed defect's seed must run clean and its probe of the machines must
// find it absent, so a regression fails; a defect still open is marked
// Known and counted by the random test while TestOpenDefects fails naming
// it; the repeated first message is the protocol's documented behaviour
// and is marked Known.
//
// Sabotages (Config.Sabotage; the world command's sabotage= in a script)
// break one rule each, in the model of a driver or in what a machine is
// told, never in the checker; each has a script in testdata whose expected
// violations are the assertion (a checker that stops catching the rule
// fails it, and so does the script with sabotage=none). The checkpoint
// and seal rules of docs/FAULTS.md ("Checkpoints and recovery"),
// docs/PROTOCOL.md §5.4, §7.9 and docs/SESSIONS.md, and what exercises
// each, in this simulation or the hand-off's (internal/relocation/sim):
//
//	rule                                                 sabotage                 script (sabotage_*.txt)   caught as
//	a write lands only above the stored fence (Judge)    checkpoint-no-judge      checkpoint_no_judge       checkpoint-stale-write
//	a claim rewrites the checkpoint under its own fence  claim-no-fence           claim_no_fence            checkpoint-stale-write
//	a writer whose lease is not provably valid writes    checkpoint-no-lease      checkpoint_no_lease       checkpoint-unleased-write
//	  none
//	an activation starts from the last checkpoint        claim-older              claim_older               checkpoint-older-restored
//	a claim that fails starts nothing                    claim-fail-starts-empty  claim_fail_starts_empty   checkpoint-older-restored
//	no capture while a recovery pointer may be stored    capture-under-pointer    capture_under_pointer     checkpoint-holds-replayed
//	a close leaves a tombstone before its release        no-tombstone             no_tombstone              checkpoint-revived
//	a close seals admission behind what it accepted      close-no-seal            close_no_seal             handled-after-seal
//	a node past its lease proof serves nothing           no-fence                 no_fence                  two-serving
//	a Session seals a bound object before its source     (relocation/sim) skip-session-seal (its testdata)   session-route
//	  seals
//	a source fenced out serves no more                   (relocation/sim) skip-fence-out    (its testdata)   two-serving
//	a sealed source handles nothing (PROTOCOL.md §5.4)   (relocation/sim) handle-after-seal (its testdata)   duplicate, fork
//
// Not covered by any sabotage: what this model leaves out — a claim refused as Stale when an
// owner as new or newer holds the checkpoint (the model's claim takes any
// stored checkpoint), corrupt, newer-format or other-type checkpoints,
// the capture policy's timing, ReleaseEnded's tombstone, the stop's
// flush, and moves. TestCheckerCatchesCheckpointSabotages shows random
// schedules catching the sabotages their faults reach.
//
// The harness is internal/simkit's: the logical clock and event queue,
// the random source, the trace, the violations, the network's streams and
// cuts, the schedule runner and the known-defect checks. This package is
// the model.
//
// Tests: TestRandomSchedules runs -sim.schedules random schedules
// (default 2,000; env SIM_SCHEDULES; make sim-check runs 100,000) from
// -sim.seed0 and prints each failing seed with the command that replays
// it; TestScripts runs the scenario scripts in testdata (script_test.go,
// docs/ARCHITECTURE.md "Writing a scenario script"; -rewrite rewrites
// their expected outputs). The simulation has no goroutines, no
// real clock and no network; the test spreads schedules over GOMAXPROCS
// workers.
package spotsim
