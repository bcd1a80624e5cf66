// Package simkit is the harness the deterministic protocol simulations
// run on (internal/relocation/sim, internal/spotsim): everything a
// simulation needs that is not its model.
//
//   - Sched: the event queue on a logical clock. Events run in (time,
//     scheduling order) order, so a seed replays step for step.
//   - Rand: the one seeded random source every draw of a schedule comes
//     from.
//   - Harness: a Sched, a Rand, the trace and the violations found, for a
//     simulation's World to embed.
//   - Net: per-pair FIFO streams with random delays over links that can be
//     cut one or both ways (what is in flight is lost, the sender is told).
//   - RandomCuts, RandomOutages: the fault draws both fault generators make
//     the same way.
//   - Lease: a node lifecycle's owner lease on the node's own keeper
//     (internal/meshnode/lease), stepped as cluster.Node's lease loop
//     steps it; the simulation supplies the renewal's store call and what
//     a change of status does (LeaseHost).
//   - StoreMode, StoreFaults: how a store model answers a call, and the
//     draw of that answer from a schedule's per-call chances.
//   - RunSeeds: the parallel runner of random schedules, with the -sim.*
//     flags, that reports each failing seed with its replay command and the
//     end of its trace; RunWorld, Replay and CheckSameSeedSameTrace run a
//     simulation's World (its one schedule) for the tests every
//     simulation has.
//   - Defects: the table of defects a simulation found (fixed, open or
//     documented; their seeds and probes) and the checks its three
//     known-defect tests run.
//   - RunScripts, Commands, ScriptLog, CallFault, Triggers, ScriptTrace:
//     what every scenario-script environment (internal/simscript) has
//     around its own commands: world first and once, the run log with its
//     "never:" lines, store-call faults that skip, count and stop, actions
//     set off at a machine's effect, the trace and violations commands.
//
// A simulation supplies its model: nodes, store, clients and the machines
// they drive; the invariants, checked as the schedule runs and at its end
// (Harness.Violate); the effects of delivering and losing a packet; its
// fault mix; and which violations are instances of a known defect. Only
// RunSeeds reads the wall clock (to log its rate) or starts goroutines: it
// runs whole schedules, one World per goroutine.
package simkit
