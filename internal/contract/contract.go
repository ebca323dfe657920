// Package contract holds the names that components of gpujob agree on
// without calling each other: the meta keys `gpujob render` writes into a
// Nomad job and the CLI, gateway, autoscaler and sweep controller read back;
// the stat names the device plugin reports and `gpujob gpus`, `top` and the
// exporter read; the environment and the line prefixes a rank sees and
// prints; the driver and device names; the default checkpoint root; the
// Consul KV keys of the queue configuration.
//
// A name here is a wire format: a job rendered by one release is read by
// the next, so changing one is a breaking change for running jobs. The
// package imports nothing and depends on nothing, so any layer may use it.
// Copies that cannot import Go (the Python workloads under jobspecs/) are
// checked against it by contract_test.go.
package contract

// The driver and the device plugin.
const (
	// DriverName is what a job's task puts in `driver = "gpujob"`.
	DriverName = "gpujob"
	// GPUDevice is the device a training task asks Nomad for
	// (`device "nvidia/gpu"`): the device plugin's vendor/type.
	GPUDevice = "nvidia/gpu"
	// GPUDeviceType is the type part of GPUDevice, the Type of the node's
	// device resources.
	GPUDeviceType = "gpu"
	// DefaultCheckpointRoot is the driver's default checkpoint_root; the
	// renderer mounts it into containers when the spec names none.
	DefaultCheckpointRoot = "/var/lib/gpujob/checkpoints"
)

// Job meta keys. MetaKind marks a job as gpujob's and says which kind
// (`gpujob list` filters on it, the gateway and autoscaler believe a route
// only of a job whose kind is KindService).
const (
	MetaKind          = "gpujob"
	MetaWorkers       = "gpujob_workers"
	MetaGPUsPerWorker = "gpujob_gpus_per_worker"
	// MetaTask names the member task of a training job.
	MetaTask = "gpujob_task"
	// MetaRun is an image job's submission run; the container mounts the
	// run's checkpoint directory through ${NOMAD_META_gpujob_run}.
	MetaRun = "gpujob_run"
	// MetaSweep and MetaTrial name the sweep and trial of a trial's job.
	MetaSweep = "gpujob_sweep"
	MetaTrial = "gpujob_trial"
	// MetaRegistered is when `gpujob sweep submit` registered the sweep's
	// controller job (unix nanoseconds): a resubmission changes the job.
	MetaRegistered = "gpujob_registered"
	// MetaVersion and MetaNamespace are a service's version and namespace.
	MetaVersion   = "gpujob_version"
	MetaNamespace = "gpujob_namespace"
	// MetaRoute is the route a service's job claims (servekv.Route JSON).
	MetaRoute = "gpujob_route"
	// MetaQueue is the queue a train, trial or service job was submitted
	// into (a spec's queue, or --queue); absent: the default queue.
	MetaQueue = "gpujob_queue"
	// MetaAdmission marks a job the admission controller registered:
	// "<record's Consul CreateIndex>.<admission number>". The controller
	// reads it back before registering again, so that a crash between
	// registering and recording the admission never registers twice.
	MetaAdmission = "gpujob_admission"
)

// The kinds a job's MetaKind holds.
const (
	KindTrain           = "train"
	KindService         = "service"
	KindSweepController = "sweep-controller"
	KindGateway         = "gateway"
	KindExporter        = "exporter"
	KindQueueController = "queue-controller"
)

// ReservedMeta are the meta keys a spec's own meta may not set: gpujob
// writes them.
var ReservedMeta = []string{MetaKind, MetaWorkers, MetaGPUsPerWorker, MetaTask, MetaRun, MetaQueue, MetaAdmission}

// The queues' records in Consul KV (internal/queue/queuekv is their
// layout). The tree is a sibling of the rendezvous, sweeps, services and
// gateway trees, none of which it shares a prefix with: the tokens a job's
// processes can reach (the driver's, handed to every supervisor; a
// namespace's users') have write on those trees only, so no job can write
// the queue configuration. Only the operators who apply queue files hold
// write on QueueConfigKey (jobspecs/acl/consul-gpujob-queues.hcl).
const (
	// QueuePrefix is the root of the queues' tree, without a trailing
	// slash.
	QueuePrefix = "gpujob/queues"
	// QueueConfigKey holds the applied queue configuration
	// (`gpujob queue apply`): queuekv.Record JSON.
	QueueConfigKey = QueuePrefix + "/config"
	// QueueJobsPrefix holds the queued jobs' records, one per job, at
	// <QueueJobsPrefix>/<namespace>/<job ID> (internal/queue/admit's
	// JobRecord JSON). Submit writes them with a namespace user's token
	// (jobspecs/acl/consul-gpujob-queue-submit.hcl: write on the
	// namespace's subtree only); the admission controller reads them and
	// deletes a finished job's.
	QueueJobsPrefix = QueuePrefix + "/jobs"
	// QueueStatePrefix is the admission controller's own tree: only its
	// token writes there (jobspecs/acl/consul-gpujob-queue-controller.hcl),
	// users read it.
	QueueStatePrefix = QueuePrefix + "/state"
	// QueueStatusPrefix holds each queued job's status, written by the
	// controller, at <QueueStatusPrefix>/<namespace>/<job ID>
	// (admit.Status JSON): queued with position, reason and estimate,
	// admitted, preempted by whom and why.
	QueueStatusPrefix = QueueStatePrefix + "/status"
	// QueueLeaderKey is the admission controller's election key.
	QueueLeaderKey = QueueStatePrefix + "/leader"
	// QueueStatsKey holds the admission controller's counters per queue
	// (admit.Stats JSON): admissions, preemptions, refusals and the
	// admission latency histogram, written in the same transactions as the
	// status changes they count, and read by the exporter.
	QueueStatsKey = QueueStatePrefix + "/stats"
)

// Stat names the device plugin reports for each GPU. Those
// nomad-device-nvidia also reports keep its names, so dashboards built on
// `nomad node status -stats` keep working.
const (
	StatGPUUtil        = "GPU utilization"
	StatMemUtil        = "Memory utilization"
	StatEncoderUtil    = "Encoder utilization"
	StatDecoderUtil    = "Decoder utilization"
	StatTemperature    = "Temperature"
	StatMemory         = "Memory state"
	StatBAR1           = "BAR1 buffer state"
	StatPower          = "Power usage"
	StatSMClock        = "SM clock"
	StatECCCorrected   = "ECC corrected errors"
	StatECCUncorrected = "ECC uncorrected errors"
	StatThrottle       = "Throttle reasons"
	// StatXidCount counts the Xid events seen since the plugin started;
	// StatXidLast is the last one's number (0: none).
	StatXidCount = "Xid errors"
	StatXidLast  = "Last Xid"
)

// Lines a rank prints that gpujob reads.
const (
	// MetricLinePrefix starts rank 0's metric line, a JSON object with an
	// integer "step" and numeric values: `gpujob-metric: {"step": 10, "loss": 0.4}`.
	MetricLinePrefix = "gpujob-metric: "
	// ResultLinePrefix starts rank 0's final line, a JSON object of the
	// trial's results (with "steps", the step count).
	ResultLinePrefix = "gpujob-result: "
	// ProgressLinePrefix starts every rank's progress line:
	// "gpujob: step=40 epoch=0 rank=2 loss=0.6931 global_loss=0.6930 samples_per_sec=1650.2".
	ProgressLinePrefix = "gpujob: "
	// RankLinePrefix starts a line the supervisor prefixes with its rank
	// when a member runs several local processes: "[rank 3] ...".
	RankLinePrefix = "[rank "
)

// Environment variables a rank reads (besides torchrun's, which the
// supervisor sets too).
const (
	EnvRank           = "GPUJOB_RANK"
	EnvLocalRank      = "GPUJOB_LOCAL_RANK"
	EnvWorldSize      = "GPUJOB_WORLD_SIZE"
	EnvLocalWorldSize = "GPUJOB_LOCAL_WORLD_SIZE"
	EnvNodeRank       = "GPUJOB_NODE_RANK"
	EnvNNodes         = "GPUJOB_NNODES"
	EnvMasterAddr     = "GPUJOB_MASTER_ADDR"
	EnvMasterPort     = "GPUJOB_MASTER_PORT"
	EnvRestartCount   = "GPUJOB_RESTART_COUNT"
	EnvMaxRestarts    = "GPUJOB_MAX_RESTARTS"
	EnvRunID          = "GPUJOB_RUN_ID"
	EnvGeneration     = "GPUJOB_GENERATION"
	EnvCheckpointDir  = "GPUJOB_CHECKPOINT_DIR"
	// EnvCheckpointEvery is the spec's checkpoint_every, in steps.
	EnvCheckpointEvery = "GPUJOB_CHECKPOINT_EVERY"
	// EnvServiceVersion is a service's version, set in its task.
	EnvServiceVersion = "GPUJOB_SERVICE_VERSION"
)
