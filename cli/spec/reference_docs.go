package spec

import (
	"fmt"
	"strings"
	"time"
)

// Shared descriptions of the fields train and service blocks both have.
const (
	descDatacenters = "Nomad datacenters the job may run in; Nomad's default when unset."
	descNodePool    = "Nomad node pool the job runs in; Nomad's default when unset."
	descNamespace   = "Nomad namespace of the job; else the CLI's (`--namespace`, `$NOMAD_NAMESPACE`, `default`)."
	descQueue       = "Queue the job is submitted into (`gpujob queue list`); the default queue when unset. Submit's `--queue` overrides it; submit refuses a queue that does not exist, and a job its queue's quota could never hold."
	descMeta        = "Job meta. Keys `gpujob` and `gpujob_*` are gpujob's own and refused."
	descCPU         = "CPU reservation of one member, in MHz (at least 1)."
	descMemory      = "Memory reservation of one member, in MiB (at least 10)."
	descShm         = "Size of /dev/shm for DataLoader workers, in MiB. On the host the task reserves memory + shm; in a container image it is the docker driver's `shm_size`."
	descGPUModel    = "Only GPUs of this model (`${device.model}`), e.g. \"Tesla T4\"."
	descGPUMinMem   = "Only GPUs with at least this much memory (`${device.attr.memory}`), e.g. \"16 GiB\"."
)

func itoa(n int) string { return fmt.Sprint(n) }

// durString writes a duration as a spec would: "5m", not "5m0s".
func durString(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return fmt.Sprintf("%q", s)
}

// fieldDocs describes every block and attribute of a spec, by the path
// Reference gives it. Reference's test fails when this map and the
// parser's schemas disagree.
var fieldDocs = map[string]fieldDoc{
	"variable":             {desc: "An input variable, used as `var.NAME`; set with `-var NAME=VALUE` or `-var-file FILE` (HCL, or JSON for `*.json`). Later values win; `-var` wins over every file."},
	"variable.type":        {typ: "type", desc: "Type constraint of the value (`string`, `number`, `bool`, `list(string)`, …); any type when unset."},
	"variable.default":     {typ: "any", desc: "Value when none is given on the command line; without one the variable must be set."},
	"variable.description": {typ: "string", desc: "What the variable is for."},

	"train":                    {desc: "A distributed training job: `workers` allocations of the gpujob task driver, gang-started, ranked through a Consul rendezvous and restarted together from their checkpoint."},
	"train.workers":            {typ: "number", def: itoa(DefaultWorkers), desc: fmt.Sprintf("Members (allocations) of the training group, 1 to %d.", MaxWorkers)},
	"train.gpus_per_worker":    {typ: "number", def: itoa(DefaultGPUsPerWorker), desc: "`nvidia/gpu` devices per member; 0 for a CPU job. A count no node can hold is an error."},
	"train.command":            {typ: "string", desc: "Program every rank runs (a path in the image for an image job). Required."},
	"train.args":               {typ: "list(string)", desc: "Arguments of the command."},
	"train.env":                {typ: "map(string)", desc: "Environment of the ranks, on top of what the driver sets (RANK, WORLD_SIZE, MASTER_ADDR, …)."},
	"train.workdir":            {typ: "string", desc: "Absolute path where the ranks run, normally on shared storage (a path in the image for an image job); the task directory when unset."},
	"train.preload":            {typ: "list(string)", desc: "Python modules each rank slot imports once into a waiting interpreter, so that a group restart forks the ranks instead of starting Python again (warm restarts). The command must be a Python script."},
	"train.image":              {typ: "string", desc: "Container image every member runs in, through Nomad's docker driver, with the same rendezvous, ranks, checkpoints and restarts as on the host."},
	"train.max_failures":       {typ: "number", def: itoa(DefaultMaxFailures), desc: "Group restarts from the checkpoint before the job fails (the driver's `max_restarts`); 0 or more."},
	"train.rendezvous_timeout": {typ: "duration", def: durString(DefaultRendezvousTimeout), desc: "How long a rendezvous round waits for every member to join."},
	"train.checkpoint_grace":   {typ: "duration", def: durString(DefaultCheckpointGrace), desc: "How long a stopping job's ranks have between SIGTERM and SIGKILL to save a checkpoint — when the queue preempts the gang, or on a stop or drain (the tasks' `kill_timeout`; the driver keeps up to 5.5 s of it for leaving the rendezvous). 1s to 10m; above 30s the clients' `max_kill_timeout` must allow it."},
	"train.datacenters":        {typ: "list(string)", desc: descDatacenters + " `[\"*\"]` means all."},
	"train.node_pool":          {typ: "string", desc: descNodePool},
	"train.namespace":          {typ: "string", desc: descNamespace},
	"train.priority":           {typ: "number", def: itoa(DefaultPriority), desc: fmt.Sprintf("Nomad job priority, %d to %d.", MinPriority, MaxPriority)},
	"train.queue":              {typ: "string", desc: descQueue},
	"train.meta":               {typ: "map(string)", desc: descMeta},

	"train.artifact":             {desc: "A file Nomad fetches into each member before it starts (Nomad's artifact block); may repeat."},
	"train.artifact.source":      {typ: "string", desc: "URL to fetch (go-getter syntax)."},
	"train.artifact.destination": {typ: "string", desc: "Where to put it, relative to the task directory."},
	"train.artifact.options":     {typ: "map(string)", desc: "go-getter options, e.g. `checksum`."},

	"train.resources":        {desc: "One member's reservation."},
	"train.resources.cpu":    {typ: "number", def: itoa(DefaultCPU), desc: descCPU},
	"train.resources.memory": {typ: "number", def: itoa(DefaultMemoryMiB), desc: descMemory},
	"train.resources.shm":    {typ: "number", def: "0", desc: descShm},

	"train.gpu":            {desc: "Constraints on the GPUs a member gets."},
	"train.gpu.model":      {typ: "string", desc: descGPUModel},
	"train.gpu.min_memory": {typ: "string", desc: descGPUMinMem},

	"train.checkpoint":       {desc: "How often the script checkpoints."},
	"train.checkpoint.every": {typ: "number", desc: "Steps between checkpoints, given to the script as `GPUJOB_CHECKPOINT_EVERY`. Required in the block."},

	"train.image_pull":         {desc: "How the docker driver pulls `image`."},
	"train.image_pull.force":   {typ: "bool", def: "false", desc: "Pull even when the image is present (`force_pull`)."},
	"train.image_pull.timeout": {typ: "duration", desc: "Give up pulling after this long (`image_pull_timeout`); the docker driver's default when unset."},

	"train.image_pull.auth":                {desc: "Registry login; the clients' own docker credentials when unset. The password lands in the jobspec: pass it with `-var`."},
	"train.image_pull.auth.username":       {typ: "string", desc: "Registry user."},
	"train.image_pull.auth.password":       {typ: "string", desc: "Registry password."},
	"train.image_pull.auth.server_address": {typ: "string", desc: "Registry address."},

	"sweep":                   {desc: fmt.Sprintf("A hyperparameter sweep: many trials of one train block, each a Nomad job with its own values of the params, run by a controller job that keeps the best. The name is at most %d bytes.", MaxSweepNameLen)},
	"sweep.max_trials":        {typ: "number", def: "a grid's size; required otherwise", desc: fmt.Sprintf("Trials to run, 1 to %d.", MaxTrials)},
	"sweep.parallel":          {typ: "number", def: itoa(DefaultParallel), desc: "Trials running at once."},
	"sweep.max_failed_trials": {typ: "number", def: itoa(DefaultMaxFailedTrials), desc: "Failed trials after which the sweep fails; 0 or more."},
	"sweep.train":             {desc: "The job each trial runs: every field of a train block. `command`, `args` and `env` values may use `param.NAME`, as is or in a string template (`\"--lr=${param.lr}\"`). Required."},

	"sweep.param":             {desc: "One dimension of the search space, used as `param.NAME`; exactly one kind per param. At least one param is required."},
	"sweep.param.uniform":     {typ: "list(number)", desc: "`[lo, hi]`: a real number drawn uniformly."},
	"sweep.param.loguniform":  {typ: "list(number)", desc: "`[lo, hi]`: a positive real number drawn uniformly on a log scale."},
	"sweep.param.int_uniform": {typ: "list(number)", desc: "`[lo, hi]`: an integer drawn uniformly, both ends included."},
	"sweep.param.choice":      {typ: "list", desc: "Values to choose from."},
	"sweep.param.grid":        {typ: "list", desc: "Values a grid search takes each of."},

	"sweep.objective":        {desc: "The metric the trials report and the sweep optimises. Required."},
	"sweep.objective.metric": {typ: "string", desc: "A field of rank 0's `gpujob-metric:` / `gpujob-result:` JSON lines."},
	"sweep.objective.mode":   {typ: "string", def: `"max"`, desc: `"max" (larger is better) or "min".`},
	"sweep.objective.goal":   {typ: "number", desc: "The sweep ends once a trial reaches this value."},

	"sweep.search":           {desc: "How trials are proposed."},
	"sweep.search.algorithm": {typ: "string", def: fmt.Sprintf("%q", DefaultAlgorithm), desc: `"grid", "random" or "tpe" (tree-structured Parzen estimator); seeded, reproducible.`},
	"sweep.search.seed":      {typ: "number", def: "0", desc: "Seed of the random and TPE proposals; 0 or more."},

	`sweep.early_stop "asha"`:                  {desc: "Stop unpromising trials early with ASHA (asynchronous successive halving). At most one early_stop block."},
	`sweep.early_stop "asha".grace_period`:     {typ: "number", def: itoa(DefaultASHAGrace), desc: "Steps (in the metric's step units) before a trial can be stopped."},
	`sweep.early_stop "asha".reduction_factor`: {typ: "number", def: itoa(DefaultASHAReduction), desc: "One trial in this many is promoted at each rung."},
	`sweep.early_stop "median"`:                {desc: "Stop a trial whose best value is worse than the median of the others' at the same step (Optuna's MedianPruner). At most one early_stop block."},
	`sweep.early_stop "median".grace_period`:   {typ: "number", def: "0", desc: "Steps before a trial can be stopped."},
	`sweep.early_stop "median".min_trials`:     {typ: "number", def: itoa(DefaultMedianMinTrials), desc: "Trials that must have reported at a step before the rule judges it."},
	`sweep.early_stop "median".interval`:       {typ: "number", def: itoa(DefaultMedianInterval), desc: "Judge every this many steps."},

	"service":                  {desc: fmt.Sprintf("A model server: replicas of one process behind the gpujob gateway, with bearer tokens, rate limits, rolling updates and autoscaling. The name is a DNS label of at most %d characters.", MaxServiceNameLen)},
	"service.gpus_per_replica": {typ: "number", def: itoa(DefaultGPUsPerReplica), desc: "`nvidia/gpu` devices per replica; 0 or more."},
	"service.command":          {typ: "string", desc: "The server each replica runs; it listens on `$PORT`. Required."},
	"service.args":             {typ: "list(string)", desc: "Arguments of the command."},
	"service.env":              {typ: "map(string)", desc: "Environment of the server."},
	"service.workdir":          {typ: "string", desc: "Absolute path where the server runs; the task directory when unset."},
	"service.version":          {typ: "string", def: "a digest of what the replicas run", desc: "Label of what the replicas serve, in the gateway's metrics and rollbacks."},
	"service.datacenters":      {typ: "list(string)", desc: descDatacenters},
	"service.node_pool":        {typ: "string", desc: descNodePool},
	"service.namespace":        {typ: "string", desc: descNamespace},
	"service.priority":         {typ: "number", def: itoa(DefaultPriority), desc: fmt.Sprintf("Nomad job priority, %d to %d.", MinPriority, MaxPriority)},
	"service.queue":            {typ: "string", desc: descQueue},
	"service.meta":             {typ: "map(string)", desc: descMeta},

	"service.replicas":         {desc: "Bounds of the replica count."},
	"service.replicas.min":     {typ: "number", def: "1, or max when max is below 1", desc: "Fewest replicas; 0 lets the service scale to zero (the gateway holds requests and scales up)."},
	"service.replicas.max":     {typ: "number", def: "min, at least 1", desc: fmt.Sprintf("Most replicas, 1 to %d.", MaxReplicas)},
	"service.replicas.initial": {typ: "number", def: "min, at least 1 when max allows", desc: "Replicas at the first deploy; between min and max."},

	"service.health":               {desc: "The replicas' HTTP readiness check, which Consul runs and the gateway routes by."},
	"service.health.path":          {typ: "string", def: fmt.Sprintf("%q", DefaultHealthPath), desc: "Path answering 200 once the model is loaded."},
	"service.health.interval":      {typ: "duration", def: durString(DefaultHealthInterval), desc: "Time between checks, at least 1s."},
	"service.health.timeout":       {typ: "duration", def: durString(DefaultHealthTimeout), desc: "Check timeout, at least 1s and at most the interval."},
	"service.health.initial_delay": {typ: "duration", def: durString(DefaultInitialDelay), desc: "How long a replica may take to load its model: its failing check neither restarts it nor fails a deployment before then."},

	"service.update":                  {desc: "The rolling update (Nomad's update block)."},
	"service.update.canary":           {typ: "number", def: "0", desc: "Canaries placed before the old version is replaced; 0 to replicas.max."},
	"service.update.max_parallel":     {typ: "number", def: "1", desc: "Replicas replaced at once."},
	"service.update.auto_promote":     {typ: "bool", def: "true with canaries", desc: "Promote canaries once healthy; needs canary ≥ 1."},
	"service.update.auto_revert":      {typ: "bool", def: "true", desc: "Revert a version that never turns healthy, route and all."},
	"service.update.min_healthy_time": {typ: "duration", def: durString(DefaultMinHealthyTime), desc: "How long a replica must stay healthy to count."},

	"service.autoscale":                  {desc: "Set the count from the requests in flight at every gateway: ceil(load / target_inflight) within the replica bounds. Without it the count is fixed."},
	"service.autoscale.target_inflight":  {typ: "number", desc: "Requests in flight per replica to aim for; more than 0. Required in the block."},
	"service.autoscale.scale_up_delay":   {typ: "duration", def: `"0s"`, desc: "Wait this long before scaling up."},
	"service.autoscale.scale_down_delay": {typ: "duration", def: durString(DefaultScaleDownDelay), desc: "Scale down only after the load stayed lower this long."},

	"service.route":               {desc: "The gateway's route to the service."},
	"service.route.path":          {typ: "string", def: `"/<name>"`, desc: "Path prefix of plain segments, no trailing slash; stripped before forwarding."},
	"service.route.host":          {typ: "string", desc: "Match this Host header too."},
	"service.route.auth":          {typ: "bool", def: "true", desc: "Require bearer tokens (`gpujob token create`)."},
	"service.route.timeout":       {typ: "duration", def: durString(DefaultRouteTimeout), desc: "Per request; 504 beyond."},
	"service.route.queue_limit":   {typ: "number", def: itoa(DefaultQueueLimit), desc: "Requests held while no replica is healthy; 0 holds none."},
	"service.route.queue_timeout": {typ: "duration", def: durString(DefaultQueueTimeout), desc: "How long a held request waits."},
	"service.route.traefik":       {typ: "bool", def: "false", desc: "Also add Traefik Consul Catalog tags to the replicas; needs `auth = false` (Traefik would bypass the tokens)."},
	"service.route.max_body":      {typ: "string", def: "the gateway's `--max-body` (10 MiB)", desc: "Largest request body, e.g. \"2MiB\"; 1 byte to 1 GiB. 413 beyond."},

	"service.route.rate_limit":       {desc: "A token bucket per bearer token (per client address on routes without auth); 429 with Retry-After beyond."},
	"service.route.rate_limit.rps":   {typ: "number", desc: "Requests per second; more than 0. Required in the block."},
	"service.route.rate_limit.burst": {typ: "number", def: "rps rounded up", desc: "Bucket size, at least 1."},

	"service.resources":        {desc: "One replica's reservation."},
	"service.resources.cpu":    {typ: "number", def: itoa(DefaultCPU), desc: descCPU},
	"service.resources.memory": {typ: "number", def: itoa(DefaultMemoryMiB), desc: descMemory},
	"service.resources.shm":    {typ: "number", def: "0", desc: "Size of /dev/shm, in MiB; the task reserves memory + shm."},

	"service.gpu":            {desc: "Constraints on the GPUs a replica gets."},
	"service.gpu.model":      {typ: "string", desc: descGPUModel},
	"service.gpu.min_memory": {typ: "string", desc: descGPUMinMem},
}
