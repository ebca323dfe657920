// Package observe reads the state of a gpujob cluster into one Snapshot:
// every GPU with its stats and the allocation holding it, every training
// job with its members, ranks, restarts and losses, the jobs waiting for
// GPUs, the queues (their quotas, use, waiting jobs and the admission
// controller's counters), and the sweeps. The Prometheus exporter (cli/observe/metrics),
// `gpujob top` and `gpujob status` all read it, so they show the same
// numbers from the same requests.
//
// A Watcher keeps the slow-changing parts (nodes, allocations, jobs, sweeps,
// queues) current with blocking queries and reads the fast-changing GPU stats once
// per node on demand: one snapshot costs one stats request per node with
// GPUs, never one per GPU.
package observe

import (
	"time"

	"github.com/hashicorp/nomad/api"
)

// Snapshot is the cluster at one moment.
type Snapshot struct {
	// Taken is when the snapshot was assembled.
	Taken time.Time `json:"taken"`
	Nodes []Node    `json:"nodes"`
	// Jobs are the gpujob training jobs (not sweep trials, services or
	// gpujob's helper jobs), sorted by namespace and ID.
	Jobs []TrainJob `json:"jobs"`
	// Queue is every gpujob job (training, trial or service) with
	// allocations Nomad could not place yet, oldest first.
	Queue []Waiting `json:"queue"`
	// Queues summarizes each queue of the applied queue configuration
	// (gpujob queue apply), read from Consul; absent without one, or
	// while it cannot be read (Warnings says why).
	Queues []QueueSummary `json:"queues,omitempty"`
	Sweeps []Sweep        `json:"sweeps"`
	// Warnings are what could not be read (a node's stats, the sweeps'
	// records); the rest of the snapshot stands.
	Warnings []string `json:"warnings"`
}

// Node is one Nomad client with GPUs.
type Node struct {
	ID     string `json:"id"`
	Name   string `json:"name"`
	Status string `json:"status"` // ready, down, …
	GPUs   []GPU  `json:"gpus"`
	// StatsErr is why the node's stats are missing ("" when read).
	StatsErr string `json:"stats_error,omitempty"`
}

// GPU is one device instance with its latest stats. A stat the device
// could not give, or that was not read, is nil.
type GPU struct {
	UUID string `json:"uuid"`
	// Index is the GPU's position on its node (its minor number when the
	// fingerprint gives one, else its order by UUID): DCGM's "gpu" label.
	Index   int    `json:"index"`
	Vendor  string `json:"vendor"`
	Model   string `json:"model"`
	Fake    bool   `json:"fake"`
	Healthy bool   `json:"healthy"`
	// HealthDescription says why an unhealthy device is unhealthy.
	HealthDescription string `json:"health_description,omitempty"`
	// MemoryMiB is the device group's memory attribute, nil when the
	// fingerprint has none.
	MemoryMiB *int64 `json:"memory_mib,omitempty"`

	UtilPct        *float64 `json:"util_pct"`
	MemUtilPct     *float64 `json:"mem_util_pct"`
	MemUsedMiB     *float64 `json:"mem_used_mib"`
	MemTotalMiB    *float64 `json:"mem_total_mib"`
	TempC          *float64 `json:"temp_c"`
	PowerW         *float64 `json:"power_w"`
	PowerLimitW    *float64 `json:"power_limit_w"`
	SMClockMHz     *float64 `json:"sm_clock_mhz"`
	ECCCorrected   *float64 `json:"ecc_corrected"`
	ECCUncorrected *float64 `json:"ecc_uncorrected"`
	// XidErrors counts the GPU's Xid events since the device plugin
	// started; LastXid is the last one's number (0: none).
	XidErrors *float64 `json:"xid_errors"`
	LastXid   *float64 `json:"last_xid"`

	// Holder is the live allocation the GPU is reserved to, or nil.
	Holder *Holder `json:"holder"`

	// Stats are the device's stats as the device plugin gave them (nil
	// when not read): a view tells a value the device cannot give (a
	// string, "N/A") from one it has no stats for, which the numbers
	// above both leave nil.
	Stats map[string]*api.StatValue `json:"-"`
}

// Holder is the allocation (and task) holding a GPU.
type Holder struct {
	Namespace string `json:"namespace"`
	JobID     string `json:"job_id"`
	AllocID   string `json:"alloc_id"`
	AllocName string `json:"alloc_name"`
	Task      string `json:"task"`
	// Kind is the job's gpujob kind: "train", "trial", "service", or ""
	// for a job gpujob did not render.
	Kind string `json:"kind"`
	// Queue is the queue a gpujob job was submitted into (its meta), ""
	// when it names none (the default queue) or is not gpujob's.
	Queue string `json:"queue,omitempty"`
}

// TrainJob is one gpujob training job.
type TrainJob struct {
	Namespace string `json:"namespace"`
	ID        string `json:"id"`
	// Status is Nomad's: pending, running or dead.
	Status  string `json:"status"`
	Workers int    `json:"workers"` // from the job's meta, -1 if absent
	// MembersByState counts the members (the current allocation of each
	// name) by state: pending, running, complete, failed, lost.
	MembersByState map[string]int `json:"members_by_state"`
	Members        []Member       `json:"members"`
	// Round is the latest rendezvous round any member joined (0: none yet).
	Round int `json:"round"`
	// RoundSeconds is how long the latest round took to gather: from the
	// round's start (its members' task start, or the restart that began
	// it) to the last member's join. Nil before a round completed.
	RoundSeconds *float64 `json:"round_seconds"`
	// Restarts is the group restarts used; MaxRestarts the budget (-1
	// unknown).
	Restarts    int `json:"restarts"`
	MaxRestarts int `json:"max_restarts"`
	// Losses is the latest loss line per rank, by rank (empty before any,
	// or when the logs were not read).
	Losses []RankLoss `json:"losses"`
}

// Member is one allocation of a training job.
type Member struct {
	AllocID   string   `json:"alloc_id"`
	AllocName string   `json:"alloc_name"`
	NodeID    string   `json:"node_id"`
	NodeName  string   `json:"node_name"`
	State     string   `json:"state"`
	Round     int      `json:"round"`
	FirstRank int      `json:"first_rank"` // -1 before it joined
	LastRank  int      `json:"last_rank"`
	GPUs      []string `json:"gpus"` // the UUIDs reserved to it
}

// RankLoss is a rank's latest progress line.
type RankLoss struct {
	Rank int     `json:"rank"`
	Step int     `json:"step"`
	Loss float64 `json:"loss"`
	// Time is when the exporter read it (the line has no time).
	Time time.Time `json:"time"`
}

// Waiting is a job with allocations Nomad could not place.
type Waiting struct {
	Namespace string `json:"namespace"`
	JobID     string `json:"job_id"`
	Kind      string `json:"kind"` // train, trial, service
	// Queue is the job's queue (its meta), "" when it names none.
	Queue string `json:"queue,omitempty"`
	// Queued is how many allocations wait.
	Queued int `json:"queued"`
	// Since is when the job's current version was submitted.
	Since time.Time `json:"since"`
}

// Sweep is one sweep's record.
type Sweep struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Status    string `json:"status"` // running, completed, failed, stopped
	MaxTrials int    `json:"max_trials"`
	// TrialsByState counts the trials by state (pending, running,
	// stopping, completed, stopped, failed).
	TrialsByState map[string]int `json:"trials_by_state"`
	// Objective is the metric the sweep optimises; Best its best value so
	// far (nil before any trial reported).
	Objective string   `json:"objective"`
	Maximize  bool     `json:"maximize"`
	Best      *float64 `json:"best"`
	BestTrial string   `json:"best_trial,omitempty"`
	// Progress grows whenever any trial reports a new step or ends; a
	// running sweep whose progress stays put is stalled.
	Progress int `json:"progress"`
	// Updated is the controller's last save.
	Updated time.Time `json:"updated"`
}
