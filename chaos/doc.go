// Package chaos is roam's chaos test on real processes: `make
// chaos` runs every fault, `make chaos-short` a subset (with the placement
// director on every node: -director), and both print a table and fail on
// a non-zero safety figure.
//
// # The set-up
//
// Each fault runs in a fresh environment: a Consul server (or three) with a
// real data directory (`consul agent -server -bootstrap-expect=N`, not
// -dev, so a kill and a restart keep the data) on free loopback ports, and
// three node processes (`roam-chaos node`, see NodeMain) on it. The Consul
// binary is $ROAM_CONSUL, else ~/.cache/roam/consul-1.14.11/consul (`make
// consul`). Every node registers the kind "counter": an Instance Spot with
// PreserveStateWith (its count and a hash of every op that made it) under
// its default recovery: its owner checkpoints it (at most 1 s after a
// change), and a counter whose owner ended comes back from its last
// checkpoint, on its next call or by a live node's pass. The ops its ended
// owner handled after that checkpoint are on a branch of its lineage that
// ends with the ended lifecycle: lost with an ended node, as documented. Nodes run with a 4 s owner lease, a 5 s restore timeout and a
// 3 s call timeout.
//
// The driver calls each of 12 counters by Spot ID every 50 ms, through a
// random live node's HTTP endpoint (a request, or one time in four a
// one-way send, each with a unique op id, never retried), and moves a
// random counter to a random node every 150 ms.
//
// # The records
//
// Every handler run appends one JSON line (Line) to its process's record
// file with one write(2) on an O_APPEND descriptor, before it replies, so a
// SIGKILL loses nothing that was answered: the node, the process, the actor
// system (one per node lifecycle), the incarnation (the object's PID id,
// which carries its object and owner generations), the op id, and the
// state before and after. A node also records each lifecycle's start and a
// lease that ended without Stop. The driver keeps every call and its
// answer (Op). Check computes the table's figures from both; see Report.
//
// # The faults
//
//   - node-kill: SIGKILL a node, start it again as a new process (same
//     ports).
//   - target-kill-at-commit: a node kills itself the moment a move into it
//     has its cutover: the relocation driver logs each target step at
//     debug level before it runs the step's effects, and the node's log
//     writer watches for the target entering CutoverReceived or
//     CutoverFallback — relay-ready was answered in an earlier step, the
//     commit CAS has not started. No core code is changed for this.
//   - node-stop-past-ttl: SIGSTOP a node for 2×TTL+3 s (Consul ends a
//     session between TTL and 2×TTL after its last renewal), then SIGCONT.
//   - consul-stop-5s, consul-stop-25s: SIGSTOP the Consul server.
//   - consul-restart: SIGKILL Consul and start it on its data directory.
//   - consul-leader-kill: three Consul servers, each node talking to its
//     own; the nodes print a mark at a move's cutover (as above) and the
//     harness SIGKILLs the leader on the first mark, within milliseconds,
//     so during the move's commit CAS or just after it; the server starts
//     again 10 s later.
//   - net-cut: node-3 advertises a TCP proxy the test owns in front of its
//     remote port (cluster.Config.AdvertisedHost). Cut stops every byte in
//     both directions on the proxied connections and holds new ones
//     unanswered for 10 s. Every message into node-3 passes the proxy
//     (peers dial its advertised address, and replies go to the sender's
//     address), so node-3 is cut off from both peers; its own outbound
//     connections are direct, so its one-way sends still leave. Its link
//     to Consul is not cut.
//   - node-isolate-25s: node-3's remote and its Consul link both behind
//     proxies (as net-cut), both cut for 25 s: it fences itself, the
//     others revoke its lease a TTL after its last heartbeat and recover
//     its objects while it is still cut off; after the heal it rejoins as
//     a new lifecycle.
//   - consul-down-past-ttl: SIGKILL Consul and keep it down 2×TTL+3 s
//     (every node fences), then start it on its data directory.
//   - rolling-restart: a deploy, not a fault: each node in turn gets
//     SIGTERM, drains its objects to the others, stops and starts again.
//     No lifecycle ends abnormally, so nothing may be lost at all.
//   - kill-mid-drain: SIGTERM a node and SIGKILL it 300 ms into its drain;
//     what it had not moved is an ended owner's, as after node-kill.
//
// # The bound
//
// An object may stay unserved after its fault healed for at most
// Settings.Bound: 2×TTL (Consul ends an ended owner's session at most then)
// + TTL (other nodes wait that long after they first see the owner's
// descriptor gone, in case the store ended its lease early) + the restore timeout and one cutover wait (a move caught by the fault
// settles or is fenced out by then) + the call timeout (a request waiting
// on a dead route) + 5 s for a rejoin's start-up on a busy 2-core machine:
// 26 s with the settings above. Every wait in the harness is on a
// condition (READY lines, a Consul leader, every object served again) with
// a generous limit; the only sleeps are the faults' own lengths and the
// traffic periods.
package chaos
