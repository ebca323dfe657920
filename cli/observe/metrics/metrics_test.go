package metrics

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpujob/gpujob/cli/observe"
	"github.com/gpujob/gpujob/internal/queue/admit"
	"github.com/gpujob/gpujob/jobspecs/monitoring"
)

type fakeSource struct {
	snap *observe.Snapshot
	err  error
}

func (f *fakeSource) Snapshot(context.Context) (*observe.Snapshot, error) { return f.snap, f.err }
func (f *fakeSource) Changed() <-chan struct{}                            { return nil }

func fp(v float64) *float64 { return &v }

func testSnapshot(t0 time.Time) *observe.Snapshot {
	return &observe.Snapshot{Taken: t0,
		Nodes: []observe.Node{{ID: "n1", Name: "gpu-1", Status: "ready", GPUs: []observe.GPU{
			{UUID: "GPU-aaa", Index: 0, Model: "Tesla T4", Healthy: true, UtilPct: fp(12), MemUtilPct: fp(3),
				MemUsedMiB: fp(1000), MemTotalMiB: fp(15360), TempC: fp(51), PowerW: fp(30.5), SMClockMHz: fp(1590),
				ECCCorrected: fp(2), ECCUncorrected: fp(0), XidErrors: fp(3), LastXid: fp(13),
				Holder: &observe.Holder{Namespace: "ml", JobID: "bert", AllocID: "a0", AllocName: "bert.train[0]", Task: "train", Kind: "train"}},
			{UUID: "GPU-bbb", Index: 1, Model: "Tesla T4", Healthy: false, HealthDescription: "Xid 79"},
		}}},
		Jobs: []observe.TrainJob{{Namespace: "ml", ID: "bert", Status: "running", Workers: 2,
			MembersByState: map[string]int{"pending": 0, "running": 2, "complete": 0, "failed": 0, "lost": 0},
			Round:          3, RoundSeconds: fp(4.5), Restarts: 2, MaxRestarts: 3,
			Losses: []observe.RankLoss{{Rank: 0, Step: 40, Loss: 0.61}, {Rank: 1, Step: 40, Loss: 0.64}}}},
		Queue:  []observe.Waiting{{Namespace: "ml", JobID: "big", Kind: "train", Queued: 4, Since: t0.Add(-90 * time.Second)}},
		Sweeps: []observe.Sweep{{Namespace: "ml", Name: "lr", Status: "running", TrialsByState: map[string]int{"running": 2, "completed": 3}, Objective: "accuracy", Best: fp(0.91), Progress: 77}},
		Queues: testQueues(t0),
	}
}

func testQueues(t0 time.Time) []observe.QueueSummary {
	since := t0.Add(-20 * time.Minute)
	c := admit.NewStats().Queue("team-a")
	c.Admitted(2, 30*time.Second)
	c.Admitted(1, 2*time.Hour)
	c.Preemptions, c.Refusals = 1, 4
	return []observe.QueueSummary{
		{Name: "team-a", Declared: true, QuotaGPUs: 4, Borrow: true, UsedGPUs: 6, BorrowedGPUs: 2, WaitingJobs: 2, WaitingGPUs: 5,
			OldestWaitSince: &since, PreemptedJobs: 1, RefusedJobs: 1, Counters: c},
		{Name: "default", Declared: true, Counters: admit.NewStats().Queue("default")},
		{Name: "bad\"label", Declared: true, UsedGPUs: 1},
		{Name: admit.UndeclaredQueue, UsedGPUs: 1},
	}
}

// gather collects c into a map "name{k=v,...}" → value (empty labels left
// out), through a pedantic registry, which checks the descriptions too.
func gather(t *testing.T, c prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	return gather2(t, reg)
}

func value(t dto.MetricType, m *dto.Metric) float64 {
	if t == dto.MetricType_COUNTER {
		return m.GetCounter().GetValue()
	}
	return m.GetGauge().GetValue()
}

func TestCollectorDCGMNamesLabelsAndGpujobSeries(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	src := &fakeSource{snap: testSnapshot(t0)}
	got := gather(t, New(Options{Source: src, Now: func() time.Time { return t0 }}))
	held := "{Hostname=gpu-1,UUID=GPU-aaa,device=nvidia0,gpu=0,gpujob_kind=train,modelName=Tesla T4,nomad_alloc_id=a0,nomad_alloc_name=bert.train[0],nomad_job=bert,nomad_namespace=ml,nomad_task=train}"
	want := map[string]float64{
		"DCGM_FI_DEV_GPU_UTIL" + held:          12,
		"DCGM_FI_DEV_MEM_COPY_UTIL" + held:     3,
		"DCGM_FI_DEV_FB_USED" + held:           1000,
		"DCGM_FI_DEV_FB_FREE" + held:           14360,
		"DCGM_FI_DEV_GPU_TEMP" + held:          51,
		"DCGM_FI_DEV_POWER_USAGE" + held:       30.5,
		"DCGM_FI_DEV_SM_CLOCK" + held:          1590,
		"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL" + held: 2,
		"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" + held: 0,
		"DCGM_FI_DEV_XID_ERRORS" + held:        13,
		"gpujob_gpu_xid_errors_total" + held:   3,
		"gpujob_gpu_healthy{Hostname=gpu-1,UUID=GPU-aaa,device=nvidia0,gpu=0,modelName=Tesla T4}": 1,
		"gpujob_gpu_healthy{Hostname=gpu-1,UUID=GPU-bbb,device=nvidia1,gpu=1,modelName=Tesla T4}": 0,
		"gpujob_train_members{nomad_job=bert,nomad_namespace=ml,state=running}":                   2,
		"gpujob_train_members{nomad_job=bert,nomad_namespace=ml,state=failed}":                    0,
		"gpujob_train_workers{nomad_job=bert,nomad_namespace=ml}":                                 2,
		"gpujob_train_restarts_total{nomad_job=bert,nomad_namespace=ml}":                          2,
		"gpujob_train_restarts_max{nomad_job=bert,nomad_namespace=ml}":                            3,
		"gpujob_rendezvous_round{nomad_job=bert,nomad_namespace=ml}":                              3,
		"gpujob_rendezvous_round_seconds{nomad_job=bert,nomad_namespace=ml}":                      4.5,
		"gpujob_train_loss{nomad_job=bert,nomad_namespace=ml,rank=1}":                             0.64,
		"gpujob_train_step{nomad_job=bert,nomad_namespace=ml,rank=0}":                             40,
		"gpujob_queue_jobs{gpujob_kind=train}":                                                    1,
		"gpujob_queue_jobs{gpujob_kind=service}":                                                  0,
		"gpujob_queue_allocations{gpujob_kind=train,nomad_job=big,nomad_namespace=ml}":            4,
		"gpujob_queue_wait_seconds{gpujob_kind=train,nomad_job=big,nomad_namespace=ml}":           90,
		"gpujob_queue_quota_gpus{queue=team-a}":                                                   4,
		"gpujob_queue_used_gpus{queue=team-a}":                                                    6,
		"gpujob_queue_borrowed_gpus{queue=team-a}":                                                2,
		"gpujob_queue_waiting_jobs{queue=team-a}":                                                 2,
		"gpujob_queue_waiting_gpus{queue=team-a}":                                                 5,
		"gpujob_queue_oldest_wait_seconds{queue=team-a}":                                          1200,
		"gpujob_queue_preempted_jobs{queue=team-a}":                                               1,
		"gpujob_queue_refused_jobs{queue=team-a}":                                                 1,
		"gpujob_queue_admissions_total{queue=team-a}":                                             3,
		"gpujob_queue_preemptions_total{queue=team-a}":                                            1,
		"gpujob_queue_refusals_total{queue=team-a}":                                               4,
		"gpujob_queue_admission_latency_seconds_bucket{le=30,queue=team-a}":                       2,
		"gpujob_queue_admission_latency_seconds_bucket{le=3600,queue=team-a}":                     2,
		"gpujob_queue_admission_latency_seconds_bucket{le=7200,queue=team-a}":                     3,
		"gpujob_queue_admission_latency_seconds_bucket{le=+Inf,queue=team-a}":                     3,
		"gpujob_queue_admission_latency_seconds_count{queue=team-a}":                              3,
		"gpujob_queue_admission_latency_seconds_sum{queue=team-a}":                                7260,
		"gpujob_queue_quota_gpus{queue=default}":                                                  0,
		"gpujob_queue_oldest_wait_seconds{queue=default}":                                         0,
		"gpujob_queue_admissions_total{queue=default}":                                            0,
		"gpujob_queue_admission_latency_seconds_count{queue=default}":                             0,
		"gpujob_queue_used_gpus{queue=_undeclared}":                                               1,
		"gpujob_sweep_trials{nomad_namespace=ml,state=completed,sweep=lr}":                        3,
		"gpujob_sweep_running{nomad_namespace=ml,sweep=lr}":                                       1,
		"gpujob_sweep_best{nomad_namespace=ml,objective=accuracy,sweep=lr}":                       0.91,
		"gpujob_sweep_progress{nomad_namespace=ml,sweep=lr}":                                      77,
		"gpujob_exporter_up{}":                                                                    1,
		"gpujob_exporter_cluster{}":                                                               1,
		"gpujob_gpu_health_changes_total{Hostname=gpu-1,UUID=GPU-bbb}":                            0,
	}
	for k, v := range want {
		g, ok := got[k]
		if !ok {
			t.Errorf("missing %s", k)
			continue
		}
		if g != v {
			t.Errorf("%s = %v, want %v", k, g, v)
		}
	}
	// No queue name that is not one becomes a label; the undeclared
	// queue has no counters (none were read for it).
	for k := range got {
		if strings.Contains(k, "bad") {
			t.Errorf("a series of a queue whose name is not a queue name: %s", k)
		}
	}
	if _, ok := got["gpujob_queue_admissions_total{queue=_undeclared}"]; ok {
		t.Error("counters exported for a queue without them")
	}
	// A free GPU has no job labels; a stat the device could not give is absent, not 0.
	free := "{Hostname=gpu-1,UUID=GPU-bbb,device=nvidia1,gpu=1,modelName=Tesla T4}"
	if _, ok := got["DCGM_FI_DEV_GPU_UTIL"+free]; ok {
		t.Errorf("a GPU without stats exported a utilisation")
	}
}

func TestHealthChangesAndClusterRoleAndFailure(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	src := &fakeSource{snap: testSnapshot(t0)}
	cluster := false
	c := New(Options{Source: src, Cluster: func() bool { return cluster }})
	got := gather(t, c)
	for k := range got {
		if strings.HasPrefix(k, "gpujob_train_") || strings.HasPrefix(k, "gpujob_queue_") || strings.HasPrefix(k, "gpujob_sweep_") {
			t.Errorf("an exporter without the cluster role exported %s", k)
		}
	}
	if got["gpujob_exporter_cluster{}"] != 0 || got["DCGM_FI_DEV_GPU_UTIL{Hostname=gpu-1,UUID=GPU-aaa,device=nvidia0,gpu=0,gpujob_kind=train,modelName=Tesla T4,nomad_alloc_id=a0,nomad_alloc_name=bert.train[0],nomad_job=bert,nomad_namespace=ml,nomad_task=train}"] != 12 {
		t.Errorf("without the cluster role the GPU series must stay: %v", got)
	}

	// GPU-bbb recovers, then fails again: two changes, GPU-aaa none.
	snap2 := testSnapshot(t0)
	snap2.Nodes[0].GPUs[1].Healthy = true
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	src.snap = snap2
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
	src.snap = testSnapshot(t0)
	got = gather2(t, reg)
	if got["gpujob_gpu_health_changes_total{Hostname=gpu-1,UUID=GPU-bbb}"] != 2 || got["gpujob_gpu_health_changes_total{Hostname=gpu-1,UUID=GPU-aaa}"] != 0 {
		t.Errorf("health changes: %v", got)
	}

	src.err = errors.New("nomad down")
	got = gather2(t, reg)
	if got["gpujob_exporter_up{}"] != 0 {
		t.Errorf("a failed snapshot must say up 0: %v", got)
	}
}

func gather2(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var parts []string
			for _, l := range m.GetLabel() {
				if l.GetValue() != "" {
					parts = append(parts, l.GetName()+"="+l.GetValue())
				}
			}
			labels := "{" + strings.Join(parts, ",") + "}"
			if h := m.GetHistogram(); mf.GetType() == dto.MetricType_HISTOGRAM {
				// As Prometheus reads it: NAME_bucket{le}, with +Inf, _sum, _count.
				le := func(b string) string { return "{" + strings.Join(append([]string{"le=" + b}, parts...), ",") + "}" }
				for _, b := range h.GetBucket() {
					out[mf.GetName()+"_bucket"+le(strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64))] = float64(b.GetCumulativeCount())
				}
				out[mf.GetName()+"_bucket"+le("+Inf")] = float64(h.GetSampleCount())
				out[mf.GetName()+"_sum"+labels] = h.GetSampleSum()
				out[mf.GetName()+"_count"+labels] = float64(h.GetSampleCount())
				continue
			}
			out[mf.GetName()+labels] = value(mf.GetType(), m)
		}
	}
	return out
}

// TestNamesAreTheMonitoringPackagesKnownMetrics keeps the exporter and the
// alert rules' and dashboard's list of names (jobspecs/monitoring) in step:
// every series the exporter can export is known there, and every name
// known there that is not the gateway's is exported here.
func TestNamesAreTheMonitoringPackagesKnownMetrics(t *testing.T) {
	ch := make(chan *prometheus.Desc, 64)
	New(Options{}).Describe(ch)
	close(ch)
	ours := map[string]bool{"gpujob_exporter_requests_total": true} // registered by the command
	for d := range ch {
		s := d.String() // Desc{fqName: "NAME", ...}
		i := strings.Index(s, `fqName: "`) + len(`fqName: "`)
		ours[s[i:i+strings.IndexByte(s[i:], '"')]] = true
	}
	// A histogram is known by its series: NAME_bucket, _sum and _count.
	histogram := func(n string) (string, bool) {
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(n, suffix); ok {
				return base, true
			}
		}
		return "", false
	}
	known := map[string]bool{}
	for _, n := range monitoring.KnownMetrics {
		known[n] = true
		base, isHist := histogram(n)
		if !ours[n] && !(isHist && ours[base]) && !strings.HasPrefix(n, "gpujob_gateway_") {
			t.Errorf("jobspecs/monitoring knows %s, which the exporter does not export", n)
		}
	}
	for n := range ours {
		if !known[n] && !(known[n+"_bucket"] && known[n+"_sum"] && known[n+"_count"]) {
			t.Errorf("the exporter exports %s, which jobspecs/monitoring.KnownMetrics lacks", n)
		}
	}
}
