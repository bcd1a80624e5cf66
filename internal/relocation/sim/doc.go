// Package sim is the deterministic simulation of the hand-off
// (docs/PROTOCOL.md §5) as roam composes it: the pure handoff.Source and handoff.Target
// machines, run by the driver's own interpreters, on
// nodes that exchange packets over lossy links, against a Location Store
// with CAS, per-node owner leases and faulty answers, with clients sending
// requests and one-way sends to the objects — all on one logical clock,
// every choice drawn from one PCG seed, so a seed replays a schedule step
// for step (make sim SEED=<n> prints its trace).
//
// What it models, and where the model comes from:
//
//   - Nodes: the driver's registry of incarnations, its source and target
//     runs, their timers (source_run.go, target_run.go, driver.go), node
//     crash (everything held is lost), graceful stop (Extension.Stop: the
//     moves in told and counted by the driver's own targetrun.Stopping,
//     as FinishIncoming does, polled within a bound), and the owner lease:
//     the node's own keeper (internal/meshnode/lease), stepped with the
//     world's renewal answers and clock as cluster.Node's lease loop steps
//     it (renewals every RenewEvery, a node fenced at its last proven
//     renewal's send time + TTL − margin: no dispatch, no write; unfenced
//     only by a confirmed renewal), a lifecycle that ends when a renewal
//     finds the lease gone (its serving
//     incarnations fail what they hold; the process goes one follow period
//     later; rejoining is not modelled: its objects belong to an ended
//     owner).
//   - Incarnations: the relocatable mailbox's modes (Open, Sealed,
//     Redirecting, Staging, Closed), Seal/Unseal/Reopen/Redirect/OpenWith/
//     Discard with its ordering rules, the application instance (dropped by
//     CloseOut; a dispatch without it is a silent drop) and its state: the
//     length of the object's history it has handled.
//   - Neither side of a move is modelled: each move out of a node runs the
//     driver's own interpreter (internal/relocation/sourcerun), each move
//     into one the driver's target interpreter
//     (internal/relocation/targetrun), over this world's primitives
//     (sourceenv.go, targetenv.go: the incarnation's mailbox modes,
//     packets, store calls, scheduler timers; the checks at effects live
//     there), VerifySource included. The driver's decisions around the
//     runs are the shared pure ones, asked on this world's facts: a
//     prepare's admission (handoff.AdmitPrepare), VerifySource's pause at
//     the restore deadline (handoff.VerifyPause), a move's refusals
//     (handoff.RefuseStart), a capability answer (admit.Capability), whose
//     a control message is (handoff.Attribute), and what becomes of a
//     dead-lettered send (package redelivery). The rest of the driver is a
//     model: Message Follow and the routes clients drop on a follow
//     (Config.OnFollow); the redelivery worker's store look-up; a removed
//     target's stub answering Unavailable for one follow period, then gone
//     (dead letters). Not modelled: tickets, membership checks
//     (every source is a member), a SpotWide Spot's RelocationReady
//     callback and a Join's callback message, Session bindings of
//     SpotWide members, a member's leave, the Spot manager's reclaim of
//     abandoned reservations' capacity slots.
//   - Capacity slots (Config.Capacity, slots.go; random schedules bound
//     the nodes half the time): slots in the store under each node's
//     lease, an object's record naming its slot; a move's target takes
//     one per participant before relay-ready (handoff.ArrivalSlots), its
//     commit activates them and frees the source's (handoff.Commit's slot
//     ops), a move that did not commit frees what it took; the picks,
//     the judging of answers and the frees are capslots'.
//   - The in-flight payload budget (Config.Budget, budget.go): each
//     node's moves out ask the driver's own budget
//     (internal/relocation/budget) for admission before the seal and
//     send their chunks as it lets them go; targets credit what they
//     received, and a move's budget returns at relay-ready (the Source's
//     ReturnBudget), at its end (Ended), and with every other move's to
//     its peer when the connection is lost (sourcerun.ConnectionLost). TestRandomSchedulesWithBudget draws budgets smaller
//     than a chunk and bursts of moves out of one node (make sim SEED=<n>
//     BUDGET=1 replays one).
//   - Cross-node Joins (Config.Joins, join.go): an Actor joins a
//     SpotWide Spot on another node as the driver's JoinSpot does it:
//     the Spot's record must take it (handoff.JoinTarget), the Actor
//     moves there with the Join, the target admits it (admit.Join) and
//     holds the Spot in place until the Actor serves there, and the
//     commit's transaction (handoff.Commit's Join) writes the Actor's
//     owner and membership and the Spot's member count at once.
//     TestRandomSchedulesWithJoins (make sim SEED=<n> JOINS=1).
//   - SpotWide units (Config.Members, unit.go): some objects are SpotWide
//     User Spots whose members (Actors) live on the Spot's node; random
//     schedules draw them, and the sends to members and the moves of a
//     member alone, from a stream of their own. A move of a Spot takes
//     its members as admit.SpotWide picks them (a member's own move is
//     refused, as startSource refuses it); the target admits them by
//     admit.Members, VerifySource judges their records by the commit's
//     VerifyMembers, and the commit's transaction (handoff.Commit with
//     its Members, as the driver's commitPlan composes it) changes every
//     participant's record at once.
//   - Store: one record per object (version, owner node and generation,
//     owner generation, object generation, RelocationId, a member's Spot,
//     a Spot's member count), CAS on the version, transactions of several
//     records, reads of several at once,
//     every write carrying the writer's lease check (location.Leased), a
//     watch, outages for everyone or one node, and per-call answers: ok,
//     conflict, unavailable, indeterminate after applying, indeterminate
//     without applying, slow (applies and answers late, maybe after the
//     caller's context ended), hang, and a late write for scenarios.
//   - Bound Sessions (Config.Sessions, gateway.go): each client is also
//     its Session's owner (the gateway), running the driver's own Session
//     owner interpreter (internal/session/sessionrun) over packets and
//     scheduler timers; every object but a SpotWide member is bound to one
//     client's Session. A
//     bound move asks for the seal (command 42, given up after the
//     machine's SessionSealWait), the source releases it once it serves
//     again (44), the target sends the route update after it opened (43);
//     held messages, hold limits and the seal timeout are the Session
//     owner's own, and the source's side of 42 and 44 is sourcerun's. Replay a schedule of
//     TestRandomSchedulesWithSessions with make sim SEED=<n> SESSIONS=1.
//   - Network: each direction of each pair is a FIFO stream with random
//     delays (streams reorder against each other); cuts in one or both
//     directions lose what is in flight and tell the sending side
//     (ConnectionLost, routed to the moves out to that peer by the driver's
//     own sourcerun.ConnectionLost), and a send on a cut link tells it
//     again (a failed reconnect); slow packets.
//
// The invariants are listed in check.go. The protocol defects the
// simulation found are listed in known.go's defects table, each with its
// seed. A fixed defect's seed must run clean and its
// probe of the machine must find it absent, so a regression fails; a
// defect still open is marked Known and counted by the random test (which
// goes on finding others) while TestOpenDefects fails naming it.
//
// A new effect of either machine is interpreted in sourcerun or
// targetrun, with whatever primitive it needs added to its Env (the
// driver's and this world's). Either panics with its type name while
// unknown.
//
// The harness is internal/simkit's: the logical clock and event queue,
// the random source, the trace, the violations, the network's streams and
// cuts, the schedule runner and the known-defect checks. This package is
// the model.
//
// Tests: the scenarios are scripts, testdata/*.txt, each a scripted world
// with one fault and the outcome it must print (TestScripts; the commands
// are in script_test.go and docs/ARCHITECTURE.md, "Writing a scenario
// script"). TestRandomSchedules runs -sim.schedules random schedules (default
// 2,000; env SIM_SCHEDULES) from -sim.seed0 and prints each failing seed
// with the command that replays it. The simulation has no goroutines, no
// real clock and no sleeps; the test spreads schedules over GOMAXPROCS
// workers.
package sim
