package monitoring

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/gpujob/gpujob/internal/testpriv"
)

// tool returns the path of a Prometheus tool, or skips the test.
func tool(t *testing.T, name string) string {
	t.Helper()
	return testpriv.NeedCommand(t, name, "apt-get install prometheus")
}

func run(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func parseRules(t *testing.T, b []byte) ruleFile {
	t.Helper()
	var rf ruleFile
	if err := yaml.Unmarshal(b, &rf); err != nil {
		t.Fatal(err)
	}
	return rf
}

var wantAlerts = map[string]string{ // alert → its `for:` ("" for none)
	"GPUJobGPUUnhealthy":           "1m",
	"GPUJobLowGPUUtilization":      "10m",
	"GPUJobRestartsClimbing":       "",
	"GPUJobRestartBudgetExhausted": "",
	"GPUJobQueueWaiting":           "",
	"GPUJobQueuedTooLong":          "",
	"GPUJobSweepStalled":           "",
	"GPUJobGateway5xxRatio":        "2m",
	"GPUJobGatewayP99High":         "5m",
}

func TestPromtoolCheckRules(t *testing.T) {
	promtool := tool(t, "promtool")
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, RulesFile), Rules())
	out := run(t, dir, promtool, "check", "rules", RulesFile)
	if want := fmt.Sprintf("SUCCESS: %d rules found", len(wantAlerts)); !strings.Contains(out, want) {
		t.Fatalf("promtool check rules: want %q:\n%s", want, out)
	}
}

func TestPromtoolTestRules(t *testing.T) {
	promtool := tool(t, "promtool")
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, RulesFile), Rules())
	writeFile(t, filepath.Join(dir, RulesTestFile), mustRead(RulesTestFile))
	out := run(t, dir, promtool, "test", "rules", RulesTestFile)
	if !strings.Contains(out, "SUCCESS") {
		t.Fatalf("promtool test rules:\n%s", out)
	}
	// Every alert is tested.
	tests := string(mustRead(RulesTestFile))
	for a := range wantAlerts {
		if !strings.Contains(tests, "alertname: "+a+"\n") {
			t.Errorf("%s has no test of %s", RulesTestFile, a)
		}
	}
}

func TestRulesShape(t *testing.T) {
	rf := parseRules(t, Rules())
	got := map[string]bool{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if got[r.Alert] {
				t.Errorf("alert %s twice", r.Alert)
			}
			got[r.Alert] = true
			want, ok := wantAlerts[r.Alert]
			if !ok {
				t.Errorf("unexpected alert %q", r.Alert)
				continue
			}
			if r.For != want {
				t.Errorf("%s: for %q, want %q", r.Alert, r.For, want)
			}
			if s := r.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("%s: severity %q", r.Alert, s)
			}
			for _, a := range []string{"summary", "description"} {
				if len(strings.TrimSpace(r.Annotations[a])) < 20 {
					t.Errorf("%s: annotation %s %q too short", r.Alert, a, r.Annotations[a])
				}
			}
		}
	}
	for a := range wantAlerts {
		if !got[a] {
			t.Errorf("alert %s missing", a)
		}
	}
}

func TestShortenFor(t *testing.T) {
	promtool := tool(t, "promtool")
	short := ShortenFor(Rules(), "10s")
	rf := parseRules(t, short)
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			want := ""
			if wantAlerts[r.Alert] != "" {
				want = "10s"
			}
			if r.For != want {
				t.Errorf("%s: for %q after ShortenFor, want %q", r.Alert, r.For, want)
			}
		}
	}
	// Only the durations changed.
	if got, want := forLineRE.ReplaceAll(short, []byte("${1}X")), forLineRE.ReplaceAll(Rules(), []byte("${1}X")); !bytes.Equal(got, want) {
		t.Error("ShortenFor changed more than the for: durations")
	}
	// The low utilisation alert now fires 10 s after the GPUs go idle.
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, RulesFile), short)
	writeFile(t, filepath.Join(dir, "short.test.yml"), []byte(`rule_files: [`+RulesFile+`]
evaluation_interval: 5s
tests:
  - interval: 5s
    input_series:
      - series: 'DCGM_FI_DEV_GPU_UTIL{gpu="0",nomad_namespace="default",nomad_job="bert",gpujob_kind="train"}'
        values: '20x10'
      - series: 'gpujob_train_members{nomad_namespace="default",nomad_job="bert",state="running"}'
        values: '1x10'
    promql_expr_test:
      - expr: ALERTS{alertname="GPUJobLowGPUUtilization"}
        eval_time: 5s
        exp_samples:
          - labels: 'ALERTS{alertname="GPUJobLowGPUUtilization",alertstate="pending",severity="warning",nomad_namespace="default",nomad_job="bert"}'
            value: 1
      - expr: ALERTS{alertname="GPUJobLowGPUUtilization"}
        eval_time: 10s
        exp_samples:
          - labels: 'ALERTS{alertname="GPUJobLowGPUUtilization",alertstate="firing",severity="warning",nomad_namespace="default",nomad_job="bert"}'
            value: 1
`))
	run(t, dir, promtool, "check", "rules", RulesFile)
	run(t, dir, promtool, "test", "rules", "short.test.yml")
}

// renderFileSD writes a file_sd configuration, the rules and target files
// to dir, and returns the configuration's path.
func renderFileSD(t *testing.T, dir string, groups map[string][]TargetGroup) string {
	t.Helper()
	rules := filepath.Join(dir, "rules", RulesFile)
	if err := os.MkdirAll(filepath.Dir(rules), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, rules, Rules())
	sd := filepath.Join(dir, "sd")
	if err := os.MkdirAll(sd, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{ExporterService, GatewayService} {
		if err := WriteFileSD(filepath.Join(sd, s+".json"), groups[s]); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := RenderPrometheusConfig(ConfigOptions{FileSDDir: sd, RulesPath: rules})
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(cfg, []byte("{{")) {
		t.Fatalf("placeholder left:\n%s", cfg)
	}
	path := filepath.Join(dir, "prometheus.yml")
	writeFile(t, path, cfg)
	return path
}

func TestPromtoolCheckConfig(t *testing.T) {
	promtool := tool(t, "promtool")
	dir := t.TempDir()
	path := renderFileSD(t, dir, map[string][]TargetGroup{ExporterService: {{Targets: []string{"10.0.0.1:9400"}, Labels: map[string]string{"__meta_consul_node": "n1"}}}})
	out := run(t, dir, promtool, "check", "config", path)
	if !strings.Contains(out, "SUCCESS: 1 rule files found") {
		t.Fatalf("promtool check config:\n%s", out)
	}
	// The embedded file as the shell recipe uses it: relative rules, a sed.
	dir2 := t.TempDir()
	writeFile(t, filepath.Join(dir2, RulesFile), Rules())
	writeFile(t, filepath.Join(dir2, "prometheus.yml"), bytes.ReplaceAll(mustRead(ConfigFile), []byte(placeholderFileSDDir), []byte("sd")))
	run(t, dir2, promtool, "check", "config", "prometheus.yml")
}

// TestConsulSDConfig checks prometheus-consul-sd.yml, which Debian's
// promtool cannot (no Consul SD): rendered, it is prometheus.yml with
// consul_sd_configs in place of file_sd_configs.
func TestConsulSDConfig(t *testing.T) {
	b, err := RenderPrometheusConfig(ConfigOptions{ConsulAddr: "127.0.0.1:8500", ConsulToken: "secret", RulesPath: "/r/a.yml"})
	if err != nil {
		t.Fatal(err)
	}
	fb, err := RenderPrometheusConfig(ConfigOptions{FileSDDir: "/sd", RulesPath: "/r/a.yml"})
	if err != nil {
		t.Fatal(err)
	}
	var c, f map[string]any
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(fb, &f); err != nil {
		t.Fatal(err)
	}
	sc := c["scrape_configs"].([]any)
	sf := f["scrape_configs"].([]any)
	if len(sc) != 2 || len(sf) != 2 {
		t.Fatalf("scrape configs: %d and %d", len(sc), len(sf))
	}
	for i, job := range []string{ExporterService, GatewayService} {
		jc, jf := sc[i].(map[string]any), sf[i].(map[string]any)
		if jc["job_name"] != job || jf["job_name"] != job {
			t.Errorf("job %d: %v, %v, want %s", i, jc["job_name"], jf["job_name"], job)
		}
		sd := jc["consul_sd_configs"].([]any)[0].(map[string]any)
		if sd["server"] != "127.0.0.1:8500" || sd["token"] != "secret" || !reflect.DeepEqual(sd["services"], []any{job}) {
			t.Errorf("%s: consul_sd_configs %v", job, sd)
		}
		files := jf["file_sd_configs"].([]any)[0].(map[string]any)["files"]
		if !reflect.DeepEqual(files, []any{"/sd/" + job + ".json"}) {
			t.Errorf("%s: file_sd files %v", job, files)
		}
		delete(jc, "consul_sd_configs")
		delete(jf, "file_sd_configs")
		if !reflect.DeepEqual(jc, jf) {
			t.Errorf("%s differs beyond service discovery:\n%v\n%v", job, jc, jf)
		}
	}
	delete(c, "scrape_configs")
	delete(f, "scrape_configs")
	if !reflect.DeepEqual(c, f) {
		t.Errorf("the configurations differ:\n%v\n%v", c, f)
	}
	g := c["global"].(map[string]any)
	if g["scrape_interval"] != "5s" || g["evaluation_interval"] != "5s" {
		t.Errorf("global %v", g)
	}
	if !reflect.DeepEqual(c["rule_files"], []any{"/r/a.yml"}) {
		t.Errorf("rule_files %v", c["rule_files"])
	}
	if _, err := RenderPrometheusConfig(ConfigOptions{}); err == nil {
		t.Error("no FileSDDir nor ConsulAddr: no error")
	}
	if _, err := RenderPrometheusConfig(ConfigOptions{ConsulAddr: "a\"b"}); err == nil {
		t.Error("a quote in ConsulAddr: no error")
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

type apiAnswer struct {
	Status    string          `json:"status"`
	Error     string          `json:"error"`
	ErrorType string          `json:"errorType"`
	Data      json.RawMessage `json:"data"`
}

// TestPrometheusLive starts Debian's prometheus with the rendered file_sd
// configuration and the rules, and checks through its HTTP API that it
// loaded every rule, discovered the targets from the files, and accepts
// every expression of Exprs.
func TestPrometheusLive(t *testing.T) {
	prom := tool(t, "prometheus")
	start := time.Now()
	dir := t.TempDir()
	groups := map[string][]TargetGroup{
		ExporterService: {{Targets: []string{"127.0.0.1:1"}, Labels: map[string]string{"__meta_consul_node": "node-1"}}},
		GatewayService:  {{Targets: []string{"127.0.0.1:2"}, Labels: map[string]string{"__meta_consul_node": "node-2"}}},
	}
	cfg := renderFileSD(t, dir, groups)
	port := freePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	var logs bytes.Buffer
	cmd := exec.Command(prom, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		fmt.Sprintf("--web.listen-address=127.0.0.1:%d", port), "--log.level=warn")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus:\n%s", logs.String())
		}
	}()
	client := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := client.Get(base + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready after 20s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("prometheus ready in %v", time.Since(start).Round(time.Millisecond))

	get := func(path string, form url.Values) apiAnswer {
		t.Helper()
		var resp *http.Response
		var err error
		if form == nil {
			resp, err = client.Get(base + path)
		} else {
			resp, err = client.PostForm(base+path, form)
		}
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var a apiAnswer
		if err := json.Unmarshal(b, &a); err != nil {
			t.Fatalf("%s: %v: %s", path, err, b)
		}
		return a
	}

	exprs, err := Exprs()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range exprs {
		a := get("/api/v1/query", url.Values{"query": {e.PromQL}})
		if a.Status != "success" {
			t.Errorf("%s: %s: %s\n%s", e, a.ErrorType, a.Error, e.PromQL)
		}
		// A range query too, as Grafana sends them.
		now := time.Now()
		a = get("/api/v1/query_range", url.Values{"query": {e.PromQL}, "start": {fmt.Sprint(now.Add(-time.Hour).Unix())},
			"end": {fmt.Sprint(now.Unix())}, "step": {"15"}})
		if a.Status != "success" {
			t.Errorf("%s (range): %s: %s", e, a.ErrorType, a.Error)
		}
	}
	t.Logf("%d expressions accepted", len(exprs))

	// Every rule loaded and healthy.
	a := get("/api/v1/rules", nil)
	var rules struct {
		Groups []struct {
			Rules []struct {
				Name, Type, Health, LastError string
			}
		}
	}
	if err := json.Unmarshal(a.Data, &rules); err != nil {
		t.Fatal(err)
	}
	loaded := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			loaded[r.Name] = true
			if r.Type != "alerting" || r.Health == "err" {
				t.Errorf("rule %s: type %s, health %s %s", r.Name, r.Type, r.Health, r.LastError)
			}
		}
	}
	for alert := range wantAlerts {
		if !loaded[alert] {
			t.Errorf("prometheus did not load %s", alert)
		}
	}

	// Both scrape jobs found their target, with the consul_node label.
	for {
		a = get("/api/v1/targets", nil)
		var targets struct {
			ActiveTargets []struct {
				Labels map[string]string `json:"labels"`
			} `json:"activeTargets"`
		}
		if err := json.Unmarshal(a.Data, &targets); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, tg := range targets.ActiveTargets {
			got = append(got, tg.Labels["job"]+" "+tg.Labels["instance"]+" "+tg.Labels["consul_node"])
		}
		sort.Strings(got)
		want := []string{"gpujob-exporter 127.0.0.1:1 node-1", "gpujob-gateway-admin 127.0.0.1:2 node-2"}
		if slices.Equal(got, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("active targets %q, want %q", got, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("done in %v", time.Since(start).Round(time.Millisecond))
}

func TestMetricNamesKnown(t *testing.T) {
	if !sort.StringsAreSorted(KnownMetrics) {
		t.Error("KnownMetrics not sorted")
	}
	known := map[string]bool{}
	for _, m := range KnownMetrics {
		known[m] = true
	}
	exprs, err := Exprs()
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, e := range exprs {
		names := MetricNames(e.PromQL)
		if len(names) == 0 {
			t.Errorf("%s: no metric name in %q", e, e.PromQL)
		}
		for _, n := range names {
			used[n] = true
			if !known[n] {
				t.Errorf("%s: unknown metric %q in %q", e, n, e.PromQL)
			}
		}
	}
	// The panels the issue asks for draw on every group of metrics.
	for _, m := range []string{"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_TEMP",
		"DCGM_FI_DEV_POWER_USAGE", "gpujob_gpu_healthy", "gpujob_train_members", "gpujob_train_restarts_total",
		"gpujob_rendezvous_round_seconds", "gpujob_train_loss", "gpujob_queue_jobs", "gpujob_queue_wait_seconds",
		"gpujob_sweep_trials", "gpujob_sweep_best", "gpujob_gateway_requests_total",
		"gpujob_gateway_request_duration_seconds_bucket", "gpujob_queue_used_gpus", "gpujob_queue_quota_gpus",
		"gpujob_queue_borrowed_gpus", "gpujob_queue_waiting_jobs", "gpujob_queue_waiting_gpus", "gpujob_queue_preempted_jobs",
		"gpujob_queue_oldest_wait_seconds", "gpujob_queue_admission_latency_seconds_bucket", "gpujob_queue_admissions_total",
		"gpujob_queue_preemptions_total", "gpujob_queue_refusals_total"} {
		if !used[m] {
			t.Errorf("%s not used", m)
		}
	}
}

func TestMetricNames(t *testing.T) {
	for expr, want := range map[string][]string{
		`up`: {"up"},
		`sum by (namespace, le) (rate(a_bucket{code=~"5..", x="by (y)"}[5m])) / on (namespace) group_left (le) b offset 30m`: {"a_bucket", "b"},
		`histogram_quantile(0.99, sum without (instance) (rate(x[1h30m]))) > 2 and bool c`:                                   {"c", "x"},
		`{__name__="x"} + 1e3 + 0x1f + Inf + NaN`:                                                                            nil,
		"max by (a) (m)\n# a comment naming z\n and on (a) n":                                                                {"m", "n"},
		`DCGM_FI_DEV_GPU_UTIL{Hostname=~".*"}`:                                                                               {"DCGM_FI_DEV_GPU_UTIL"},
	} {
		got := MetricNames(expr)
		if len(got) == 0 && len(want) == 0 {
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("MetricNames(%q) = %q, want %q", expr, got, want)
		}
	}
}

func TestSubstitute(t *testing.T) {
	for in, want := range map[string]string{
		`rate(x{Hostname=~"$Hostname"}[$__rate_interval])`:        `rate(x{Hostname=~".*"}[1m])`,
		`x{a=~"${nomad_job}", b=~"${service:regex}", c=~"[[c]]"}`: `x{a=~".*", b=~".*", c=~".*"}`,
		`increase(x[$__range]) / $__range_s`:                      `increase(x[1h]) / 3600`,
		`avg_over_time(x[$__interval])`:                           `avg_over_time(x[1m])`,
		`x{a="5.."}`:                                              `x{a="5.."}`,
	} {
		if got := Substitute(in); got != want {
			t.Errorf("Substitute(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestExprs(t *testing.T) {
	exprs, err := Exprs()
	if err != nil {
		t.Fatal(err)
	}
	alerts, panels := 0, 0
	for _, e := range exprs {
		if e.File == RulesFile {
			alerts++
		} else if strings.HasPrefix(e.Origin, "panel ") {
			panels++
		}
		if strings.Contains(e.PromQL, "$") || strings.Contains(e.PromQL, "[[") {
			t.Errorf("%s: variable left in %q", e, e.PromQL)
		}
	}
	if alerts != len(wantAlerts) {
		t.Errorf("%d alert expressions, want %d", alerts, len(wantAlerts))
	}
	d, err := parseDashboard(Dashboard())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range d.allPanels() {
		n += len(p.Targets)
	}
	if panels != n || n == 0 {
		t.Errorf("%d panel expressions, the dashboard has %d targets", panels, n)
	}
}

// varUseRE finds a non-built-in Grafana variable and what precedes it.
var varUseRE = regexp.MustCompile(`(.{0,3})\$\{?([a-zA-Z_][a-zA-Z0-9_]*)`)

func TestDashboard(t *testing.T) {
	b := Dashboard()
	if !json.Valid(b) {
		t.Fatal("not JSON")
	}
	d, err := parseDashboard(b)
	if err != nil {
		t.Fatal(err)
	}
	if d.SchemaVersion < 36 || d.UID == "" || d.Title == "" {
		t.Errorf("schemaVersion %d, uid %q, title %q", d.SchemaVersion, d.UID, d.Title)
	}
	vars := map[string]variable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	if v, ok := vars["DS_PROMETHEUS"]; !ok || v.Type != "datasource" || v.queryString() != "prometheus" {
		t.Errorf("no datasource variable DS_PROMETHEUS of Prometheus data sources: %+v", v)
	}
	for _, name := range []string{"Hostname", "nomad_namespace", "nomad_job", "service", "queue"} {
		v, ok := vars[name]
		if !ok || v.Type != "query" {
			t.Errorf("no query variable %s", name)
			continue
		}
		if v.AllValue != ".*" || v.Datasource == nil || v.Datasource.UID != "${DS_PROMETHEUS}" {
			t.Errorf("variable %s: allValue %q, datasource %+v", name, v.AllValue, v.Datasource)
		}
	}
	ids := map[int]string{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if prev, dup := ids[p.ID]; dup || p.ID == 0 {
				t.Errorf("panel %q: id %d (also %q)", p.Title, p.ID, prev)
			}
			ids[p.ID] = p.Title
			if len(p.GridPos) == 0 {
				t.Errorf("panel %q: no gridPos", p.Title)
			}
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if p.Title == "" {
				t.Errorf("panel %d has no title", p.ID)
			}
			if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${DS_PROMETHEUS}" {
				t.Errorf("panel %q: datasource %+v", p.Title, p.Datasource)
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q: no target", p.Title)
			}
			refs := map[string]bool{}
			for _, tg := range p.Targets {
				if tg.RefID == "" || refs[tg.RefID] {
					t.Errorf("panel %q: refId %q empty or repeated", p.Title, tg.RefID)
				}
				refs[tg.RefID] = true
				if tg.Datasource == nil || tg.Datasource.UID != "${DS_PROMETHEUS}" {
					t.Errorf("panel %q target %s: datasource %+v", p.Title, tg.RefID, tg.Datasource)
				}
				// Variables ("All" is .*) only in regular-expression matchers.
				for _, m := range varUseRE.FindAllStringSubmatch(tg.Expr, -1) {
					if _, builtin := builtinValues[m[2]]; builtin {
						continue
					}
					if _, ok := vars[m[2]]; !ok {
						t.Errorf("panel %q target %s: undefined variable $%s", p.Title, tg.RefID, m[2])
					}
					if !strings.HasSuffix(m[1], `=~"`) && !strings.HasSuffix(m[1], `!~"`) {
						t.Errorf("panel %q target %s: $%s outside a =~ matcher", p.Title, tg.RefID, m[2])
					}
				}
			}
		}
	}
	walk(d.Panels)
	titles := map[string]bool{}
	for _, p := range d.allPanels() {
		titles[p.Title] = true
	}
	for _, want := range []string{"GPU utilisation per GPU", "GPU memory used / free", "GPU temperature", "GPU power", "GPU health",
		"Members by state", "Restarts", "Rendezvous round seconds", "Loss per rank", "Queue length", "Queue wait",
		"Trials by state", "Best objective", "Requests per second", "5xx ratio", "Latency p99 / p50",
		"Queue GPUs: used, quota, borrowed", "Queued jobs and GPUs", "Oldest queued job's wait", "Admission latency p50 / p95",
		"Admissions, preemptions, refusals"} {
		if !titles[want] {
			t.Errorf("no panel %q", want)
		}
	}
}

func TestWriteFileSDAndTargetGroups(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "x.json")
	if err := WriteFileSD(p, nil); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); strings.TrimSpace(string(b)) != "[]" {
		t.Errorf("empty file_sd: %q", b)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("temporary files left: %v", ents)
	}
}

// fakeConsul answers /v1/catalog/service/<name> like Consul: index 5 at
// first, then (blocking on index 5) index 6 once change is closed.
func fakeConsul(t *testing.T, change chan struct{}) *http.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/catalog/service/", func(w http.ResponseWriter, r *http.Request) {
		svc := strings.TrimPrefix(r.URL.Path, "/v1/catalog/service/")
		if r.Header.Get("X-Consul-Token") != "tok" {
			http.Error(w, "ACL not found", http.StatusForbidden)
			return
		}
		idx := r.URL.Query().Get("index")
		type entry map[string]any
		ents := []entry{{"Node": "node-1", "Address": "10.0.0.1", "Datacenter": "dc1", "ServiceID": svc + "-1", "ServiceName": svc,
			"ServicePort": 9400, "ServiceTags": []string{"a", "b"}, "ServiceMeta": map[string]string{"alloc-id": "x"}}}
		index := "5"
		if idx == "5" || idx == "6" {
			select {
			case <-change:
			case <-r.Context().Done():
				return
			}
			index = "6"
			if svc == GatewayService {
				ents = append(ents, entry{"Node": "node-2", "Address": "10.0.0.2", "ServiceAddress": "10.0.1.2", "Datacenter": "dc1",
					"ServiceID": svc + "-2", "ServiceName": svc, "ServicePort": 8080})
			}
			if idx == "6" {
				<-r.Context().Done()
				return
			}
		}
		w.Header().Set("X-Consul-Index", index)
		_ = json.NewEncoder(w).Encode(ents)
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(l) }()
	srv.Addr = l.Addr().String()
	return srv
}

func TestSyncConsulFileSD(t *testing.T) {
	change := make(chan struct{})
	srv := fakeConsul(t, change)
	defer srv.Close()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	writes := make(chan string, 10)
	done := make(chan error, 1)
	go func() {
		done <- SyncConsulFileSD(ctx, srv.Addr, "tok", dir, nil, func(s string, n int) { writes <- fmt.Sprintf("%s %d", s, n) })
	}()
	wait := func(want ...string) {
		t.Helper()
		var got []string
		for range want {
			select {
			case w := <-writes:
				got = append(got, w)
			case <-ctx.Done():
				t.Fatalf("writes %q, want %q", got, want)
			}
		}
		sort.Strings(got)
		if !slices.Equal(got, want) {
			t.Fatalf("writes %q, want %q", got, want)
		}
	}
	wait("gpujob-exporter 1", "gpujob-gateway-admin 1")
	close(change)
	wait("gpujob-gateway-admin 2") // the exporter's list did not change: no write
	var groups []TargetGroup
	b, err := os.ReadFile(filepath.Join(dir, GatewayService+".json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &groups); err != nil {
		t.Fatal(err)
	}
	want := []TargetGroup{
		{Targets: []string{"10.0.0.1:9400"}, Labels: map[string]string{"__meta_consul_node": "node-1", "__meta_consul_address": "10.0.0.1",
			"__meta_consul_dc": "dc1", "__meta_consul_service": GatewayService, "__meta_consul_service_id": GatewayService + "-1",
			"__meta_consul_service_address": "", "__meta_consul_service_port": "9400", "__meta_consul_tags": ",a,b,",
			"__meta_consul_service_metadata_alloc_id": "x"}},
		{Targets: []string{"10.0.1.2:8080"}, Labels: map[string]string{"__meta_consul_node": "node-2", "__meta_consul_address": "10.0.0.2",
			"__meta_consul_dc": "dc1", "__meta_consul_service": GatewayService, "__meta_consul_service_id": GatewayService + "-2",
			"__meta_consul_service_address": "10.0.1.2", "__meta_consul_service_port": "8080", "__meta_consul_tags": ",,"}},
	}
	if !reflect.DeepEqual(groups, want) {
		t.Errorf("gateway targets:\n%+v\nwant\n%+v", groups, want)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("SyncConsulFileSD: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("SyncConsulFileSD did not return after cancel")
	}
}
