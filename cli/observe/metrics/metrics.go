// Package metrics exports an observe.Snapshot as Prometheus metrics: each
// GPU under the names and labels of NVIDIA's DCGM exporter (so dashboards
// written for it work unchanged), with the Nomad job, namespace and
// allocation holding it, and gpujob's own series for training jobs, the
// queue, sweeps and GPU health.
//
// Every scrape takes one snapshot: the watched state plus one stats
// request per node, never one per GPU.
package metrics

import (
	"context"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"github.com/gpujob/gpujob/cli/observe"
)

// The DCGM exporter's labels, then gpujob's.
var gpuLabels = []string{"gpu", "UUID", "device", "modelName", "Hostname",
	"nomad_namespace", "nomad_job", "nomad_alloc_id", "nomad_alloc_name", "nomad_task", "gpujob_kind"}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

// The DCGM field names (dcgm-exporter's default counters).
var (
	dcgmUtil    = desc("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", gpuLabels...)
	dcgmMemCopy = desc("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", gpuLabels...)
	dcgmFBUsed  = desc("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", gpuLabels...)
	dcgmFBFree  = desc("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", gpuLabels...)
	dcgmTemp    = desc("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", gpuLabels...)
	dcgmPower   = desc("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", gpuLabels...)
	dcgmSMClock = desc("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", gpuLabels...)
	dcgmSBE     = desc("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total number of single-bit volatile ECC errors.", gpuLabels...)
	dcgmDBE     = desc("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.", gpuLabels...)
	dcgmXid     = desc("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered (0: none).", gpuLabels...)
	xidTotal    = desc("gpujob_gpu_xid_errors_total", "Xid events of the GPU since its device plugin started.", gpuLabels...)
)

var healthLabels = []string{"gpu", "UUID", "device", "modelName", "Hostname"}

// gpujob's own series. Job labels are nomad_namespace and nomad_job, as on
// the GPU series, so the two join.
var (
	gpuHealthy       = desc("gpujob_gpu_healthy", "1 while the device plugin reports the GPU healthy, else 0.", healthLabels...)
	gpuHealthChanges = desc("gpujob_gpu_health_changes_total", "Health changes of the GPU this exporter saw.", "UUID", "Hostname")

	trainMembers  = desc("gpujob_train_members", "Members of a training job by state.", "nomad_namespace", "nomad_job", "state")
	trainWorkers  = desc("gpujob_train_workers", "Workers a training job asks for.", "nomad_namespace", "nomad_job")
	trainRestarts = desc("gpujob_train_restarts_total", "Group restarts a training job used (from its checkpoint).", "nomad_namespace", "nomad_job")
	trainMax      = desc("gpujob_train_restarts_max", "A training job's group restart budget (max_failures).", "nomad_namespace", "nomad_job")
	rdzvRound     = desc("gpujob_rendezvous_round", "The latest rendezvous round a member of the job joined.", "nomad_namespace", "nomad_job")
	rdzvSeconds   = desc("gpujob_rendezvous_round_seconds", "How long the job's latest rendezvous round took to gather all members.", "nomad_namespace", "nomad_job")
	trainLoss     = desc("gpujob_train_loss", "The latest loss a rank printed.", "nomad_namespace", "nomad_job", "rank")
	trainStep     = desc("gpujob_train_step", "The step of the rank's latest loss line.", "nomad_namespace", "nomad_job", "rank")

	queueJobs   = desc("gpujob_queue_jobs", "gpujob jobs with allocations waiting for placement (for GPUs or other resources).", "gpujob_kind")
	queueAllocs = desc("gpujob_queue_allocations", "Allocations of the job waiting for placement.", "nomad_namespace", "nomad_job", "gpujob_kind")
	queueWait   = desc("gpujob_queue_wait_seconds", "Seconds since the waiting job's current version was submitted.", "nomad_namespace", "nomad_job", "gpujob_kind")

	// Per queue of the applied queue configuration (label queue): the
	// admission controller's queues, read from Consul.
	queueQuota       = desc("gpujob_queue_quota_gpus", "The queue's GPU quota (0: none).", "queue")
	queueUsed        = desc("gpujob_queue_used_gpus", "GPUs the queue's jobs' allocations hold: what counts against its quota.", "queue")
	queueBorrowed    = desc("gpujob_queue_borrowed_gpus", "GPUs the queue uses beyond its quota (borrowed from its cohort's idle quota).", "queue")
	queueWaitingJobs = desc("gpujob_queue_waiting_jobs", "Jobs queued and not admitted yet.", "queue")
	queueWaitingGPUs = desc("gpujob_queue_waiting_gpus", "GPUs the queue's waiting jobs ask for.", "queue")
	queueOldestWait  = desc("gpujob_queue_oldest_wait_seconds", "Seconds the queue's longest-waiting job has waited (since its submission, or its requeue after a preemption); 0 when none waits.", "queue")
	queuePreempted   = desc("gpujob_queue_preempted_jobs", "Jobs preempted and not admitted again (being stopped, or waiting again).", "queue")
	queueRefused     = desc("gpujob_queue_refused_jobs", "Jobs the admission controller refused whose records stay.", "queue")
	queueAdmissions  = desc("gpujob_queue_admissions_total", "Admissions (registrations) of the queue's jobs by the admission controller.", "queue")
	queuePreemptions = desc("gpujob_queue_preemptions_total", "The queue's jobs preempted (stopped whole and queued again) by the admission controller.", "queue")
	queueRefusals    = desc("gpujob_queue_refusals_total", "Times the admission controller refused one of the queue's jobs.", "queue")
	queueLatency     = desc("gpujob_queue_admission_latency_seconds", "Seconds from a job's submission, or its requeue after a preemption, to its admission.", "queue")

	sweepTrials   = desc("gpujob_sweep_trials", "Trials of a sweep by state.", "nomad_namespace", "sweep", "state")
	sweepRunning  = desc("gpujob_sweep_running", "1 while the sweep runs, else 0.", "nomad_namespace", "sweep")
	sweepBest     = desc("gpujob_sweep_best", "The sweep's best objective value so far.", "nomad_namespace", "sweep", "objective")
	sweepProgress = desc("gpujob_sweep_progress", "Grows with every step a trial reports for the first time and every trial that ends.", "nomad_namespace", "sweep")

	exporterCluster = desc("gpujob_exporter_cluster", "1 on the exporter that reports the cluster-wide gpujob_train, queue and sweep series.")
	exporterUp      = desc("gpujob_exporter_up", "1 when the last scrape could read the cluster, else 0.")
	snapSeconds     = desc("gpujob_exporter_snapshot_seconds", "Time the scrape took to read the cluster (the GPU stats requests).")
)

// Options configure a Collector.
type Options struct {
	Source observe.Source
	// Cluster says whether this exporter reports the cluster-wide series
	// (training jobs, queue, sweeps); nil: always. An exporter per node
	// reports them on one node only, or every series would be counted
	// once per node.
	Cluster func() bool
	// Timeout bounds one scrape's snapshot (default 10 s).
	Timeout time.Duration
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Collector is a prometheus.Collector over a Source.
type Collector struct {
	o Options

	mu      sync.Mutex
	labels  map[string]cachedLabels // UUID → its GPU series' labels
	healthy map[string]bool         // UUID → last seen health
	changes map[string]float64      // UUID → health changes seen
	host    map[string]string       // UUID → node name
}

// New returns a collector.
func New(o Options) *Collector {
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Collector{o: o, labels: map[string]cachedLabels{}, healthy: map[string]bool{}, changes: map[string]float64{},
		host: map[string]string{}}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{dcgmUtil, dcgmMemCopy, dcgmFBUsed, dcgmFBFree, dcgmTemp, dcgmPower, dcgmSMClock,
		dcgmSBE, dcgmDBE, dcgmXid, xidTotal, gpuHealthy, gpuHealthChanges, trainMembers, trainWorkers, trainRestarts, trainMax, rdzvRound,
		rdzvSeconds, trainLoss, trainStep, queueJobs, queueAllocs, queueWait, queueQuota, queueUsed, queueBorrowed,
		queueWaitingJobs, queueWaitingGPUs, queueOldestWait, queuePreempted, queueRefused, queueAdmissions,
		queuePreemptions, queueRefusals, queueLatency, sweepTrials, sweepRunning, sweepBest,
		sweepProgress, exporterCluster, exporterUp, snapSeconds} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.o.Timeout)
	defer cancel()
	start := time.Now()
	snap, err := c.o.Source.Snapshot(ctx)
	ch <- gauge(snapSeconds, time.Since(start).Seconds())
	if err != nil {
		ch <- gauge(exporterUp, 0)
		return
	}
	ch <- gauge(exporterUp, 1)
	c.collectGPUs(ch, snap)
	cluster := c.o.Cluster == nil || c.o.Cluster()
	ch <- gauge(exporterCluster, b2f(cluster))
	if cluster {
		collectCluster(ch, snap, c.o.Now())
	}
}

func gauge(d *prometheus.Desc, v float64, labels ...string) prometheus.Metric {
	return prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

func counter(d *prometheus.Desc, v float64, labels ...string) prometheus.Metric {
	return prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func (c *Collector) collectGPUs(ch chan<- prometheus.Metric, snap *observe.Snapshot) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range snap.Nodes {
		for _, g := range n.GPUs {
			idx := strconv.Itoa(g.Index)
			base := []string{idx, g.UUID, "nvidia" + idx, g.Model, n.Name}
			h := g.Holder
			if h == nil {
				h = &observe.Holder{}
			}
			pairs, hpairs := c.gpuLabelPairs(g.UUID, append(base, h.Namespace, h.JobID, h.AllocID, h.AllocName, h.Task, h.Kind))
			opt := func(d *prometheus.Desc, v *float64, vt prometheus.ValueType) {
				if v != nil {
					ch <- &gpuMetric{desc: d, labels: pairs, value: *v, counter: vt == prometheus.CounterValue}
				}
			}
			opt(dcgmUtil, g.UtilPct, prometheus.GaugeValue)
			opt(dcgmMemCopy, g.MemUtilPct, prometheus.GaugeValue)
			opt(dcgmFBUsed, g.MemUsedMiB, prometheus.GaugeValue)
			if g.MemUsedMiB != nil && g.MemTotalMiB != nil {
				free := max(*g.MemTotalMiB-*g.MemUsedMiB, 0)
				opt(dcgmFBFree, &free, prometheus.GaugeValue)
			}
			opt(dcgmTemp, g.TempC, prometheus.GaugeValue)
			opt(dcgmPower, g.PowerW, prometheus.GaugeValue)
			opt(dcgmSMClock, g.SMClockMHz, prometheus.GaugeValue)
			opt(dcgmSBE, g.ECCCorrected, prometheus.CounterValue)
			opt(dcgmDBE, g.ECCUncorrected, prometheus.CounterValue)
			opt(dcgmXid, g.LastXid, prometheus.GaugeValue)
			opt(xidTotal, g.XidErrors, prometheus.CounterValue)
			ch <- &gpuMetric{desc: gpuHealthy, labels: hpairs, value: b2f(g.Healthy)}

			if old, seen := c.healthy[g.UUID]; seen && old != g.Healthy {
				c.changes[g.UUID]++
			}
			if _, seen := c.changes[g.UUID]; !seen {
				c.changes[g.UUID] = 0
			}
			c.healthy[g.UUID], c.host[g.UUID] = g.Healthy, n.Name
		}
	}
	for uuid := range c.labels {
		if _, ok := c.healthy[uuid]; !ok {
			delete(c.labels, uuid)
		}
	}
	for uuid, n := range c.changes {
		ch <- counter(gpuHealthChanges, n, uuid, c.host[uuid])
	}
}

func collectCluster(ch chan<- prometheus.Metric, snap *observe.Snapshot, now time.Time) {
	for _, j := range snap.Jobs {
		ns, id := j.Namespace, j.ID
		for state, n := range j.MembersByState {
			ch <- gauge(trainMembers, float64(n), ns, id, state)
		}
		if j.Workers >= 0 {
			ch <- gauge(trainWorkers, float64(j.Workers), ns, id)
		}
		ch <- counter(trainRestarts, float64(j.Restarts), ns, id)
		if j.MaxRestarts >= 0 {
			ch <- gauge(trainMax, float64(j.MaxRestarts), ns, id)
		}
		ch <- gauge(rdzvRound, float64(j.Round), ns, id)
		if j.RoundSeconds != nil {
			ch <- gauge(rdzvSeconds, *j.RoundSeconds, ns, id)
		}
		for _, l := range j.Losses {
			r := strconv.Itoa(l.Rank)
			ch <- gauge(trainLoss, l.Loss, ns, id, r)
			ch <- gauge(trainStep, float64(l.Step), ns, id, r)
		}
	}
	perKind := map[string]int{observe.KindTrain: 0, observe.KindTrial: 0, observe.KindService: 0}
	for _, q := range snap.Queue {
		perKind[q.Kind]++
		ch <- gauge(queueAllocs, float64(q.Queued), q.Namespace, q.JobID, q.Kind)
		ch <- gauge(queueWait, max(now.Sub(q.Since).Seconds(), 0), q.Namespace, q.JobID, q.Kind)
	}
	for k, n := range perKind {
		ch <- gauge(queueJobs, float64(n), k)
	}
	collectQueues(ch, snap.Queues, now)
	for _, s := range snap.Sweeps {
		for state, n := range s.TrialsByState {
			ch <- gauge(sweepTrials, float64(n), s.Namespace, s.Name, state)
		}
		ch <- gauge(sweepRunning, b2f(s.Status == "running"), s.Namespace, s.Name)
		if s.Best != nil {
			ch <- gauge(sweepBest, *s.Best, s.Namespace, s.Name, s.Objective)
		}
		ch <- gauge(sweepProgress, float64(s.Progress), s.Namespace, s.Name)
	}
}

// cachedLabels are a GPU's label pairs, kept while its label values stay
// the same: 512 GPUs × 9 series would otherwise build (and sort) 50,000
// label pairs per scrape, most of a scrape's allocations.
type cachedLabels struct {
	values string // the values joined, to see a change
	pairs  []*dto.LabelPair
	health []*dto.LabelPair // gpujob_gpu_healthy's (healthLabels)
}

func (c *Collector) gpuLabelPairs(uuid string, values []string) (gpu, health []*dto.LabelPair) {
	key := strings.Join(values, "\x00")
	if cl, ok := c.labels[uuid]; ok && cl.values == key {
		return cl.pairs, cl.health
	}
	cl := cachedLabels{values: key, pairs: labelPairs(gpuLabels, values), health: labelPairs(healthLabels, values)}
	c.labels[uuid] = cl
	return cl.pairs, cl.health
}

// labelPairs pairs names with the first len(names) values, sorted by name.
func labelPairs(names, values []string) []*dto.LabelPair {
	pairs := make([]*dto.LabelPair, len(names))
	for i, name := range names {
		pairs[i] = &dto.LabelPair{Name: proto.String(name), Value: proto.String(values[i])}
	}
	sort.Slice(pairs, func(i, j int) bool { return pairs[i].GetName() < pairs[j].GetName() })
	return pairs
}

// gpuMetric is a constant sample with labels built beforehand (sorted by
// name, as prometheus.MustNewConstMetric would sort them). The pairs are
// shared by the GPU's series and never changed once built.
type gpuMetric struct {
	desc    *prometheus.Desc
	labels  []*dto.LabelPair
	value   float64
	counter bool
}

func (m *gpuMetric) Desc() *prometheus.Desc { return m.desc }

func (m *gpuMetric) Write(out *dto.Metric) error {
	out.Label = m.labels
	v := m.value
	if m.counter {
		out.Counter = &dto.Counter{Value: &v}
	} else {
		out.Gauge = &dto.Gauge{Value: &v}
	}
	return nil
}
