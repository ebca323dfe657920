// Package rendezvous lets the members of a distributed training run agree,
// through Consul, on who is in a round and which ranks they hold: "Consul in,
// ranks out". It imports nothing of Nomad; one member is one Nomad allocation
// in the driver, but here it is just an ID, a name, an address and a local
// world size.
//
// # Key layout
//
// Everything of a run lives under P = Prefix + "/" + RunID + "/":
//
//	P/ctl/round       the round record (JSON): number, status, restarts, size,
//	                  last failure. Written only with check-and-set on its
//	                  ModifyIndex.
//	P/ctl/leader      the coordinator lock, acquired with a member's session.
//	P/ctl/roster      members of the complete round in rank order (gzip'd
//	                  text, one member a line), written in the transaction
//	                  that marks the round complete and deleted in the one
//	                  that ends it: the watch answer that shows a round
//	                  complete carries its roster.
//	P/m/live/<ID>     a member's registration, acquired with its session (so
//	                  it vanishes when the session is invalidated: allocation
//	                  lost, node down, TTL missed); value {member, generation}.
//	P/m/done/<ID>     written by Done: the member finished successfully. It is
//	                  not bound to the session, so the coordinator can tell a
//	                  member that finished and left from one that died.
//
// Members block on P/ctl/ only, a prefix that changes a handful of times per
// round (leader elected with round 1, round complete, round ended). Only the
// coordinator watches P/m/, which changes with every join. That keeps the
// requests per member constant in the number of members: about five to the
// first round (session, watch, registration, two watch answers).
//
// Runs of one job: with Config.RunGroup = "ns/job" and RunID =
// "ns/job/<submission>", each submission of the job is its own run with its
// own rounds and restart budget, while a replacement member within a
// submission (node lost) continues that submission's run.
//
// # Shape
//
// The pieces follow etcd's client/v3/concurrency:
//
//   - Session (internal/consul): a Consul session with its own renewal
//     loop; Done closes when it is lost for good, Err says why.
//   - the election (election.go): the coordinator lock P/ctl/leader, held
//     with the member's session and followed through the P/ctl/ watch every
//     member keeps anyway.
//   - decide (decide.go): the coordinator's judgement as a pure function of
//     the round record, the registrations, the roster and the last-call
//     timer; coordinator.go only reads, calls decide and writes.
//   - Rendezvous (rendezvous.go, join.go, close.go): the facade the
//     supervisor uses — Open, Join, Watch, Fail, Done, Close, Stop.
//
// # Algorithm
//
//  1. Open creates the member's session (Behavior=delete, TTL, bound to the
//     node's serfHealth check unless configured otherwise) and keeps it
//     renewed; it deletes the dead runs of its RunGroup; one background
//     goroutine per member long-polls P/ctl/ with blocking queries and
//     publishes what it sees.
//  2. Whenever P/ctl/leader is free, a member tries to acquire it, after a
//     random wait of up to 2 ms a member of Max (at most 2 s), unless the
//     watch shows it taken first: every try is a Raft write, and all
//     members see the lock free at once. The first holder creates round 1
//     in the same transaction. The holder runs the coordinator until its
//     session or the lock goes.
//  3. Join registers P/m/live/<ID> with the generation it wants: the open
//     round's number, or the next one if the current round is already
//     complete without it (a late joiner or a spare). Nobody registers
//     before round 1 exists: while P/ctl/ holds no key, Consul wakes every
//     watch of it on each write nearby.
//  4. The coordinator for an open round N counts live
//     registrations for N: with Max of them, or with at least Min once
//     LastCall has passed since Min was reached, it writes the roster and
//     CAS-marks the round complete in one transaction.
//  5. Join returns once the record is complete and the roster names it;
//     ranks follow from the order. If JoinTimeout passes first, the member
//     whose timer fires first CAS-writes the round as timed out with who
//     joined and who is missing, and every waiting member returns that same
//     error.
//  6. While round N runs, Fail (any member) or the coordinator (a member's
//     registration vanished without a done key; or, with Min<Max, a new member
//     registered for N+1) CAS-writes the record to "round N+1 open" with the
//     failure, consuming one restart of the shared budget (a membership
//     change consumes none). With the budget spent, the record becomes
//     "exhausted" instead. Watch fires on any of these; members Join again.
//  7. Close destroys the session. The last member out (no live registration
//     left) deletes P when the run is over (all members of the last round
//     done, join timeout, or restarts exhausted), in a transaction guarded by
//     the round record's index; otherwise (members died and Nomad will
//     reschedule them) it keeps the record so the next members continue its
//     round numbers and restart count. The next submission of the job
//     deletes such a run when it opens (if no member of it is live), in a
//     transaction guarded by the run's round record and lock key.
//
// # Fault model
//
// A Consul request that fails is transient unless Consul answered 4xx:
// refused connections, EOF, timeouts and 5xx ("No cluster leader") are what
// an agent restart or a leader election look like, and every request is
// retried with capped exponential backoff (50 ms doubling to 2 s, jittered)
// for as long as its caller allows: Join until JoinTimeout (+2 s to record
// the timeout), Fail, Done, Close, Stop and Purge until their ctx ends, the
// watches and the coordinator for ever. A coordinator write that fails is
// retried on its own timer, since nothing may change in Consul to wake it.
// Writes are idempotent or compare-and-set, so a retry of a write that did
// land either repeats it harmlessly or loses its CAS and re-reads.
//
// Nothing but Consul's answer that the member's session does not exist
// (renewal gets 404) ends a session: renewal runs every TTL/2 and retries
// errors with a backoff capped at TTL/4, without the one-TTL limit of
// api.Session.RenewPeriodic. Consul re-arms every session's TTL (at twice
// the TTL) when a leader is elected, so sessions survive a server restart
// or a leader election, and training goes on untouched: Watch delivers
// nothing during an outage. A session that is lost (TTL missed, node check
// failed, destroyed from outside) invalidates the member's registration;
// the coordinator ends the round as that member's failure, the member's own
// Watch reports it, and the member creates a new session (retrying) so that
// its next Join registers again.
//
// Deployment: with a Consul cluster of 3 (or 5) servers, each node runs a
// Consul client agent and the supervisors talk to that local agent, which
// forwards to the servers: a server restart or a leader election is then a
// few seconds of 5xx answers, retried. By default a session is bound to the
// local agent's serfHealth check, so a node that Consul declares failed
// ends its members at once; a client agent restarted with a leave
// (leave_on_terminate) also fails that check and ends them. Set
// Config.SessionTTLOnly to bind sessions to their TTL alone (a local agent
// restart is then survived if it is back within 2×SessionTTL, and a dead
// node is noticed after 2×SessionTTL), or Config.SessionNodeChecks for
// other checks.
//
// # Rank order
//
// Node rank is the position in the round's member list, sorted by Name in
// natural order ("train[2]" before "train[10]"), then by ID. Names come from
// Nomad's allocation names, so a replacement allocation for a dead member
// takes the dead member's rank, and every member derives nothing itself: the
// coordinator writes the order once and everyone reads the same record.
package rendezvous
