// Package consul is gpujob's toolkit of coordination primitives on Consul
// sessions, in the shape of etcd's client/v3/concurrency:
//
//   - Session: a session kept alive by its own renewal loop, with Done and
//     Err saying when and why it ended.
//   - Mutex: a KV lock held under a Session, taken with blocking queries.
//   - Election: a Mutex whose value names the leader, with Observe, Leader
//     and a Lost signal for the holder.
//   - Watch: the one blocking-query loop (Consul's index rules, a minimum
//     gap between calls, backoff with jitter, failure and recovery hooks).
//
// The rendezvous, the sweep controller and reporter, the gateway and its
// autoscaler build on it. It imports nothing of the driver, the CLI or
// Nomad.
package consul
