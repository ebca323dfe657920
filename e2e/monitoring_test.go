package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/jobspecs/monitoring"
)

// prometheus is a real Prometheus (Debian's 2.42) scraping a dev cluster's
// exporters and gateway, found in Consul.
type prometheus struct {
	addr string
	cmd  *exec.Cmd
}

// startPrometheus runs Prometheus on the cluster with the repository's
// config and alert rules, the rules' `for:` shortened to forDur (only the
// test's clock differs from production's: the expressions are the same).
func (c *cluster) startPrometheus(t *testing.T, forDur string) *prometheus {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus is not installed (Debian's package; scripts/install-deps.sh installs it)")
	}
	dir := t.TempDir()
	sdDir := filepath.Join(dir, "sd")
	sctx, cancel := context.WithCancel(context.Background())
	sdDone := make(chan error, 1)
	go func() {
		sdDone <- monitoring.SyncConsulFileSD(sctx, c.env["CONSUL_HTTP_ADDR"], c.secret("consul-management"), sdDir, nil, nil)
	}()
	rules := filepath.Join(dir, "rules.yml")
	if err := os.WriteFile(rules, monitoring.ShortenFor(monitoring.Rules(), forDur), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := monitoring.RenderPrometheusConfig(monitoring.ConfigOptions{FileSDDir: sdDir, RulesPath: rules})
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	p := &prometheus{addr: addr}
	p.cmd = exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
		cancel()
		<-sdDone
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("prometheus log:\n%s", tail(string(b), 3000))
		}
	})
	if err := waitFor(30*time.Second, func() bool {
		resp, err := http.Get("http://" + addr + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}); err != nil {
		t.Fatalf("prometheus was not ready in 30 s")
	}
	return p
}

// sample is one series of an instant query's answer.
type sample struct {
	Metric map[string]string
	Value  float64
}

// query runs an instant query; an error of Prometheus is returned, not
// fatal, for the expression check.
func (p *prometheus) query(q string) ([]sample, error) {
	resp, err := http.Get("http://" + p.addr + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("decoding the answer (%s): %w", resp.Status, err)
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("%s", body.Error)
	}
	var out []sample
	for _, r := range body.Data.Result {
		s, _ := r.Value[1].(string)
		v, _ := strconv.ParseFloat(s, 64)
		out = append(out, sample{Metric: r.Metric, Value: v})
	}
	return out, nil
}

// waitQuery waits until q's answer satisfies ok, and returns it.
func (p *prometheus) waitQuery(t *testing.T, timeout time.Duration, what, q string, ok func([]sample) bool) []sample {
	t.Helper()
	var last []sample
	var lastErr error
	if err := waitFor(timeout, func() bool {
		last, lastErr = p.query(q)
		return lastErr == nil && ok(last)
	}); err != nil {
		t.Fatalf("%s: `%s` did not come within %s; last answer %v (error %v)", what, q, timeout, last, lastErr)
	}
	return last
}

// fakeGPUs sets the dev client's fake GPUs through its control file
// (nvml.FakeControl): per-GPU values by UUID.
func (c *cluster) fakeGPUs(t *testing.T, client string, gpus map[string]map[string]any) {
	t.Helper()
	dir := c.env["GPUJOB_FAKE_GPU_DIR"]
	if dir == "" {
		t.Fatal("the dev cluster has no GPUJOB_FAKE_GPU_DIR")
	}
	b, _ := json.Marshal(map[string]any{"gpus": gpus})
	path := filepath.Join(dir, client+".json")
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestMonitoringPrometheusScrapesExporterAndAlertFires runs Debian's real
// Prometheus against the dev cluster's exporter (a Nomad system job) and
// gateway with the repository's config and alert rules, and checks: the
// fake GPUs' values are what `gpujob gpus` shows, every PromQL expression of
// the rules and the Grafana dashboard evaluates, a training job's restart
// counter counts a `kill -9` of a rank, its losses per rank arrive, and the
// low-utilisation alert fires on a job whose GPUs idle (its `for:` shortened
// to 10 s) and not on one whose GPUs are busy.
func TestMonitoringPrometheusScrapesExporterAndAlertFires(t *testing.T) {
	c := needCluster(t)
	c.nodeGPUs(t, fakeGPUsPerClient)
	if c.env["GPUJOB_EXPORTER_ADDR"] == "" {
		t.Fatal("the dev cluster runs no exporter (GPUJOB_DEV_EXPORTER)")
	}
	const client = "gpujob-dev-client-1"
	t.Cleanup(func() { os.Remove(filepath.Join(c.env["GPUJOB_FAKE_GPU_DIR"], client+".json")) })

	// Every GPU gets a utilisation of its own: 61, 62, ...
	out, errOut, code := c.gpujob(t, time.Minute, "gpus", "-json")
	if code != 0 {
		t.Fatalf("gpujob gpus: %s", errOut)
	}
	var report struct {
		GPUs []struct {
			ID string `json:"id"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal([]byte(out), &report); err != nil || len(report.GPUs) != c.gpusPerClient() {
		t.Fatalf("gpujob gpus -json: %v\n%s", err, out)
	}
	want := map[string]float64{}
	control := map[string]map[string]any{}
	for i, g := range report.GPUs {
		want[g.ID] = float64(61 + i)
		control[g.ID] = map[string]any{"util_pct": 61 + i, "temp_c": 50 + i}
	}
	c.fakeGPUs(t, client, control)

	start := time.Now()
	p := c.startPrometheus(t, "10s")
	// Prometheus's values are the ones gpujob gpus shows.
	p.waitQuery(t, 90*time.Second, "the fake GPUs' utilisation in Prometheus", "DCGM_FI_DEV_GPU_UTIL", func(ss []sample) bool {
		if len(ss) != len(want) {
			return false
		}
		for _, s := range ss {
			if want[s.Metric["UUID"]] != s.Value || s.Metric["job"] != monitoring.ExporterService ||
				s.Metric["Hostname"] != client || s.Metric["modelName"] == "" {
				return false
			}
		}
		return true
	})
	t.Logf("Prometheus had the exporter's GPU values %s after it started", time.Since(start).Round(time.Second))
	out, _, _ = c.gpujob(t, time.Minute, "gpus", "-json")
	var shown struct {
		GPUs []struct {
			ID   string   `json:"id"`
			Util *float64 `json:"utilization_pct"`
			Temp *float64 `json:"temperature_c"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal([]byte(out), &shown); err != nil {
		t.Fatal(err)
	}
	temps, err := p.query("DCGM_FI_DEV_GPU_TEMP")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range shown.GPUs {
		if g.Util == nil || *g.Util != want[g.ID] {
			t.Errorf("gpujob gpus shows %s at %v%%, Prometheus %v%%", g.ID, g.Util, want[g.ID])
		}
		found := false
		for _, s := range temps {
			if s.Metric["UUID"] == g.ID && g.Temp != nil && s.Value == *g.Temp {
				found = true
			}
		}
		if !found {
			t.Errorf("the temperature of %s: gpujob gpus %v, Prometheus %v", g.ID, g.Temp, temps)
		}
	}

	// A training job: both members' GPUs idle at 10 %; later one rank killed.
	job := "e2e-monitored"
	j := c.trainJob(t, job, 2, 1, []string{"--steps", "8000", "--sleep-per-step", "0.05"})
	// The meta `gpujob render` writes, by which the exporter knows a
	// training job (the hand-written jobspec has none).
	j.Meta = map[string]string{"gpujob": "train", "gpujob_workers": "2", "gpujob_task": "train"}
	leaks := c.leakCheckOnFailure(t, job)
	c.register(t, j)
	leaks.snapshotAtCleanup()
	t.Cleanup(func() { c.purge(job) })
	allocs := c.waitAllocs(t, ctx(t, 2*time.Minute), job, "every member running", func(as []*api.AllocationListStub) bool {
		return len(as) == 2 && allIn(api.AllocClientStatusRunning)(as)
	})
	held := c.heldGPUs(t, allocs)
	for id := range control {
		if held[id] {
			control[id] = map[string]any{"util_pct": 10}
		} else {
			control[id] = map[string]any{"util_pct": 95}
		}
	}
	c.fakeGPUs(t, client, control)

	// Every expression of the rules and the dashboard evaluates against
	// the live data (an error here is a broken panel or rule).
	exprs, err := monitoring.Exprs()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range exprs {
		if _, err := p.query(e.PromQL); err != nil {
			t.Errorf("%s: %v", e, err)
		}
	}
	t.Logf("%d PromQL expressions of the rules and the dashboard evaluated", len(exprs))

	fired := p.waitQuery(t, 2*time.Minute, "the low-utilisation alert",
		`ALERTS{alertname="GPUJobLowGPUUtilization",alertstate="firing"}`, func(ss []sample) bool { return len(ss) > 0 })
	for _, s := range fired {
		if s.Metric["nomad_job"] != job {
			t.Errorf("the low-utilisation alert fired for %v, not only for %s", s.Metric, job)
		}
	}
	t.Logf("the low-utilisation alert fired for %s", job)
	p.waitQuery(t, 90*time.Second, "the losses per rank", fmt.Sprintf(`gpujob_train_loss{nomad_job=%q}`, job),
		func(ss []sample) bool { return len(ss) == 2 })

	// kill -9 one rank: the group restarts once, and Prometheus counts it.
	if err := c.waitCheckpoint(job, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	pids := ranks(allocIDs(allocs)...)
	if len(pids) != 2 {
		t.Fatalf("rank processes: %v", pids)
	}
	if err := kill9(pids[1]); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	p.waitQuery(t, 2*time.Minute, "the restart counter", fmt.Sprintf(`gpujob_train_restarts_total{nomad_job=%q}`, job),
		func(ss []sample) bool { return len(ss) == 1 && ss[0].Value == 1 })
	t.Logf("Prometheus counted the restart %s after the kill", time.Since(killed).Round(time.Second))
	p.waitQuery(t, time.Minute, "the rendezvous round", fmt.Sprintf(`gpujob_rendezvous_round{nomad_job=%q}`, job),
		func(ss []sample) bool { return len(ss) == 1 && ss[0].Value >= 2 })

	// Busy GPUs clear the alert: it resolves once the job's GPUs are at 95 %.
	for id := range control {
		control[id] = map[string]any{"util_pct": 95}
	}
	c.fakeGPUs(t, client, control)
	p.waitQuery(t, time.Minute, "the alert to resolve", `ALERTS{alertname="GPUJobLowGPUUtilization"}`,
		func(ss []sample) bool { return len(ss) == 0 })

	if _, _, err := c.nomad.Jobs().Deregister(job, true, nil); err != nil {
		t.Fatal(err)
	}
	c.waitAllocs(t, ctx(t, 2*time.Minute), job, "the job stopped", func(as []*api.AllocationListStub) bool {
		return allIn(api.AllocClientStatusComplete, api.AllocClientStatusFailed)(as)
	})
	c.assertNoLeaks(t, job, allocIDs(allocs)...)
}

// heldGPUs is the set of GPU IDs reserved to the allocations.
func (c *cluster) heldGPUs(t *testing.T, allocs []*api.AllocationListStub) map[string]bool {
	t.Helper()
	held := map[string]bool{}
	for _, s := range allocs {
		a, _, err := c.nomad.Allocations().Info(s.ID, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, tr := range a.AllocatedResources.Tasks {
			for _, d := range tr.Devices {
				for _, id := range d.DeviceIDs {
					held[id] = true
				}
			}
		}
	}
	if len(held) != len(allocs) {
		ids := make([]string, 0, len(held))
		for id := range held {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		t.Fatalf("the members hold GPUs %s, want one each", strings.Join(ids, ","))
	}
	return held
}
