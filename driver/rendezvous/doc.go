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
//	P/ctl/round       the round record (JSON): number, status, restarts, members
//	                  in rank order, last failure. Written only with
//	                  check-and-set on its ModifyIndex.
//	P/ctl/leader      the coordinator lock, acquired with a member's session.
//	P/roster          members of the latest complete round in rank order
//	                  (gzip'd text, one member a line), written in the same
//	                  transaction that marks the round complete; read once
//	                  per member per round, kept out of the watched record.
//	P/m/live/<ID>     a member's registration, acquired with its session (so
//	                  it vanishes when the session is invalidated: allocation
//	                  lost, node down, TTL missed); value {member, generation}.
//	P/m/done/<ID>     written by Done: the member finished successfully. It is
//	                  not bound to the session, so the coordinator can tell a
//	                  member that finished and left from one that died.
//
// Members block on P/ctl/ only, a prefix that changes a handful of times per
// round (leader elected, round opened, round complete, round ended). Only the
// coordinator watches P/m/, which changes with every join. That keeps the
// requests per member constant in the number of members.
//
// # Algorithm
//
//  1. Open creates the member's session (Behavior=delete, TTL, the node's
//     serfHealth check) and keeps it renewed; one background goroutine per
//     member long-polls P/ctl/ with blocking queries and publishes what it sees.
//  2. Whenever P/ctl/leader is free, a member tries to acquire it; the holder
//     runs the coordinator until its session or the lock goes.
//  3. Join registers P/m/live/<ID> with the generation it wants: the open
//     round's number, or the next one if the current round is already
//     complete without it (a late joiner or a spare).
//  4. The coordinator creates round 1, and for an open round N counts live
//     registrations for N: with Max of them, or with at least Min once
//     LastCall has passed since Min was reached, it writes the roster and
//     CAS-marks the round complete in one transaction.
//  5. Join returns once the record is complete and the roster names it;
//     ranks follow from the order. If JoinTimeout passes first, the member whose timer fires
//     first CAS-writes the round as timed out with who joined and who is
//     missing, and every waiting member returns that same error.
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
//     round numbers and restart count.
//
// # Rank order
//
// Node rank is the position in the round's member list, sorted by Name in
// natural order ("train[2]" before "train[10]"), then by ID. Names come from
// Nomad's allocation names, so a replacement allocation for a dead member
// takes the dead member's rank, and every member derives nothing itself: the
// coordinator writes the order once and everyone reads the same record.
package rendezvous
