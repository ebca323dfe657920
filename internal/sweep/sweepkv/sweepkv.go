// Package sweepkv is the layout of a sweep's records in Consul KV: the keys
// and the JSON each holds. It is the contract between the three writers of a
// sweep — the CLI (gpujob sweep), the controller, and each trial's supervisor
// (which forwards the trial's metric lines) — so none of them parses another's
// output. It imports nothing of Nomad or Consul.
//
//	<prefix>/<ns>/<sweep>/spec                 Spec          CLI writes; controller reads
//	<prefix>/<ns>/<sweep>/state                (controller)  controller and CLI check-and-set
//	<prefix>/<ns>/<sweep>/lock                 -             the controller's Consul lock
//	<prefix>/<ns>/<sweep>/trials/<trial>/metrics  Metrics    the trial's reporting supervisor
//	<prefix>/<ns>/<sweep>/trials/<trial>/stop     StopRequest the controller; the supervisor obeys
//
// Every name segment is safename-encoded, so a namespace, sweep or trial name
// can never leave its place in the tree.
package sweepkv

import (
	"fmt"
	"time"

	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/safename"
)

// DefaultPrefix is where sweeps live unless the driver's and the CLI's
// sweep_key_prefix say otherwise. It is a sibling of the rendezvous tree
// ("gpujob/rendezvous"), so ACL policies can grant each on its own.
const DefaultPrefix = "gpujob/sweeps"

// Metric line prefixes. Rank 0 prints one JSON object per line after the
// prefix; the supervisor forwards them (see Metrics). The result line is
// the workload's last word and counts as a point too.
const (
	MetricLinePrefix = contract.MetricLinePrefix
	ResultLinePrefix = contract.ResultLinePrefix
)

// MaxPoints bounds Metrics.Points so the record stays far below Consul's
// 512 KiB value limit: past it, the reporter thins the older half.
const MaxPoints = 2000

// SweepKey is the root of one sweep's records, without a trailing slash.
func SweepKey(prefix, namespace, sweep string) string {
	return fmt.Sprintf("%s/%s/%s", prefix, safename.Encode(namespace), safename.Encode(sweep))
}

// SpecKey, StateKey and LockKey are the sweep's own records.
func SpecKey(prefix, namespace, sweep string) string {
	return SweepKey(prefix, namespace, sweep) + "/spec"
}
func StateKey(prefix, namespace, sweep string) string {
	return SweepKey(prefix, namespace, sweep) + "/state"
}
func LockKey(prefix, namespace, sweep string) string {
	return SweepKey(prefix, namespace, sweep) + "/lock"
}

// TrialKey is the root of one trial's records, without a trailing slash.
func TrialKey(prefix, namespace, sweep, trial string) string {
	return SweepKey(prefix, namespace, sweep) + "/trials/" + safename.Encode(trial)
}

// MetricsKey holds the trial's Metrics; StopKey the controller's StopRequest.
func MetricsKey(prefix, namespace, sweep, trial string) string {
	return TrialKey(prefix, namespace, sweep, trial) + "/metrics"
}
func StopKey(prefix, namespace, sweep, trial string) string {
	return TrialKey(prefix, namespace, sweep, trial) + "/stop"
}

// Point is one metric line of rank 0: the step it names and its numeric
// fields (non-numeric fields are dropped; "step" itself is not a value).
type Point struct {
	Step   int                `json:"step"`
	Values map[string]float64 `json:"values"`
	// Final marks the gpujob-result line, whose step is the result's
	// "steps" field (or the last point's step when it has none).
	Final bool `json:"final,omitempty"`
}

// Metrics is the record a trial's reporting supervisor keeps at MetricsKey.
// The supervisor writes it with a Consul KV acquire under its own session,
// so the pair's Session field is set exactly while a live supervisor
// reports: a trial whose supervisor or node died is never shown running.
type Metrics struct {
	// Points in step order. A trial that resumes from a checkpoint reports
	// steps it reported before: a point whose step is not greater than the
	// last one replaces every point from that step on.
	Points []Point `json:"points"`
	// Rewinds counts how often the points were rewound that way.
	Rewinds int `json:"rewinds,omitempty"`
	// Updated is when the supervisor last wrote the record.
	Updated time.Time `json:"updated"`
	// Reporting counts what the trial's reporting supervisors took and
	// wrote, and what their budgets held back, over every supervisor of
	// the trial.
	Reporting Reporting `json:"reporting,omitzero"`
}

// Reporting is what a trial's reporting supervisors counted. A supervisor
// writes the record at most once a second, writes a result at once only
// while a small allowance lasts, and spends from a byte budget on every
// write (internal/sweep/report.Budget): a rank that prints faster has its
// lines coalesced into fewer writes, which these counters make visible.
type Reporting struct {
	// Points are the metric and result lines taken into the record.
	Points int64 `json:"points"`
	// Writes are the record's writes to Consul.
	Writes int64 `json:"writes"`
	// ResultsDeferred counts writes of a result that waited for the
	// write interval because the results' allowance was spent.
	ResultsDeferred int64 `json:"results_deferred,omitempty"`
	// ByteBudgetWaits counts writes delayed by the byte budget.
	ByteBudgetWaits int64 `json:"byte_budget_waits,omitempty"`
	// DroppedLines counts lines of rank 0 longer than a metric line may
	// be (64 KiB), skipped unread.
	DroppedLines int64 `json:"dropped_lines,omitempty"`
}

// Plus is the sum of two counts (a record resumed by another supervisor).
func (r Reporting) Plus(o Reporting) Reporting {
	return Reporting{Points: r.Points + o.Points, Writes: r.Writes + o.Writes, ResultsDeferred: r.ResultsDeferred + o.ResultsDeferred,
		ByteBudgetWaits: r.ByteBudgetWaits + o.ByteBudgetWaits, DroppedLines: r.DroppedLines + o.DroppedLines}
}

// Throttled says whether a budget held anything back.
func (r Reporting) Throttled() bool {
	return r.ResultsDeferred > 0 || r.ByteBudgetWaits > 0 || r.DroppedLines > 0
}

// StopRequest at StopKey asks the trial's supervisors to stop: each emits a
// task event with Reason, stops its ranks and exits successfully (a stopped
// trial is not a failed task, and must not be restarted).
type StopRequest struct {
	Reason string    `json:"reason"` // e.g. "stopped by ASHA at step 120: 0.71 < rung cut 0.78"
	At     time.Time `json:"at"`
}
