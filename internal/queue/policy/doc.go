// Package policy decides which queued gangs start, which running gangs are
// preempted for them, and why the rest wait. It is pure: the caller (the
// admission controller, the simulator, a test) builds a State — queues,
// nodes, running and pending gangs, and the time — calls Decide, and acts
// on the Decision. Nothing here reads a clock, Consul or Nomad, so the same
// code is table-tested, simulated at scale and run in production.
//
// The rules, in the order Decide applies them:
//
//   - Order: nominated jobs (those whose victims are already being stopped)
//     first, then higher class (services above batch by default), then
//     higher priority; among equals the queue with the smallest weighted
//     dominant share (DRF) goes next, and inside a queue the oldest
//     submission first (FIFO inside a priority).
//   - Quota: a queue may use its own GPUs; a queue with borrow on may also
//     use quota its cohort's other queues leave idle. A queue whose head
//     waits for quota holds back the rest of that queue (no overtaking
//     inside a queue), but not other queues.
//   - Gang fit: a gang starts only when every member fits at once, each on
//     one node (members may spread over nodes). Never partly.
//   - Backfill (EASY): the first gang that waits for capacity gets a
//     reservation at its estimated start; a later gang may start now only
//     if it ends before that (by its MaxRuntime) or uses only what the
//     reservation leaves free. A gang without MaxRuntime never runs ahead of
//     a waiting head unless it fits in what the head leaves free, and when
//     the head's start cannot be estimated nothing runs ahead of it.
//   - Preemption, of whole gangs, choosing the fewest GPU-seconds of lost
//     work (GPUs × time since start or last checkpoint): a gang may preempt
//     lower-ranked gangs of its own queue, and a queue within its quota
//     reclaims GPUs its cohort lent to queues that borrow.
//   - A quota lowered below current use preempts nothing: new admissions of
//     that queue wait until its use falls under the quota.
package policy
