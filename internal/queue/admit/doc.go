// Package admit is the queue's admission controller: it starts queued jobs
// as whole gangs, preempts whole gangs for them, and says why the rest
// wait. The decisions are internal/queue/policy's; this package reads the
// state they are made on, from Consul and Nomad, and carries them out.
//
// Keys, under the queues' tree (contract.QueuePrefix):
//
//	config                          queuekv.Record: the queues (gpujob queue apply)
//	jobs/<namespace>/<job ID>       JobRecord: a queued job, written by submit
//	                                (consul-queue-submit, per namespace)
//	state/status/<namespace>/<ID>   Status: what the controller says of it
//	state/leader                    the controller's election key
//	state/stats                     Stats: the controller's counters per
//	                                queue (admissions, preemptions,
//	                                refusals, admission latency)
//
// Only the controller's token writes state/ (consul-queue-controller);
// every write it makes checks, in the same transaction, that its session
// holds state/leader. Everything read is checked before it is believed:
// records are strict JSON of bounded size, names are checked, and a job
// record's numbers must match the Nomad job it carries, whose namespace
// must be its key's. An invalid record is refused in its status and never
// acted on; an invalid configuration stops all action.
//
// Idempotency: the controller writes its intent (Status.Admitting) before
// registering, registers the job with its admission marker in the job's
// meta (contract.MetaAdmission: "<record CreateIndex>.<admission>") and
// with Nomad's index check (no job, or the stopped job it read), and only
// then records the admission. A leader that finds an intent, or a gpujob
// allocation carrying its record's marker, reads Nomad's job: its marker
// says whether the registration happened. So a crash anywhere registers
// no admission twice. A preempted gang's status is written before its job
// is stopped, and the stop is repeated until it has; its record, with its
// original submitted_at, is untouched, so it queues again at its place.
//
// The controller's Nomad token is stronger than a submitter's: a record's
// job may ask for nothing gpujob does not render and the submitter could
// not have registered (allowlist.go: the default node pool only, no
// volumes, the gpujob and docker drivers, no tokens or templates, not
// periodic or parameterized, the controller's region). A plan that places
// the job only by Nomad's own preemption is not registered.
//
// The partial-gang guard: an admitted batch gang with fewer live members
// than it has — members that ended by themselves do not count as missing —
// for PartialGrace (Status.ShortSince) is stopped whole and requeued, as
// a preempted one. Status writes of a round go in transactions of up to
// 64 operations, each with the leader check and a check-and-set per key.
//
// Counters: a status write that records an admission, a preemption or a
// refusal carries in its transaction the check-and-set of state/stats
// with what it adds (tally.go), so a counter moves exactly when, and only
// once, the status change it counts commits.
package admit
