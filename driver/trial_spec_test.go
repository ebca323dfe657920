package driver

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/gpujob/gpujob/driver/supervisor"
)

func TestBuildSpecForASweepTrial(t *testing.T) {
	tc := &TaskConfig{Command: "x", Rendezvous: &RendezvousConfig{NNodes: "2", Port: "rdzv"}, Sweep: "bert-lr", Trial: "t0007"}
	s, err := buildSpec(taskCfg(), tc, pluginCfg(t), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	want := supervisor.ReportSpec{
		MetricsKey: "gpujob/sweeps/ml/bert-lr/trials/t0007/metrics",
		StopKey:    "gpujob/sweeps/ml/bert-lr/trials/t0007/stop",
	}
	if s.Report == nil || *s.Report != want {
		t.Fatalf("report %+v, want %+v (the job's namespace ml from Nomad)", s.Report, want)
	}

	// Without them, the task is no trial.
	s, err = buildSpec(taskCfg(), &TaskConfig{Command: "x", Rendezvous: &RendezvousConfig{NNodes: "2", Port: "rdzv"}}, pluginCfg(t), noEnv)
	if err != nil || s.Report != nil {
		t.Fatalf("report %+v, %v; want none", s.Report, err)
	}
	b, _ := json.Marshal(s)
	if strings.Contains(string(b), `"report"`) {
		t.Errorf("a spec without a trial names one: %s", b)
	}

	// The plugin's prefix; hostile names stay segments; no namespace is
	// the default one.
	pc := pluginCfg(t)
	pc.SweepKeyPrefix = "ops/sweeps"
	cfg := taskCfg()
	cfg.Namespace = ""
	tc.Sweep, tc.Trial = "../../gpujob/rendezvous", "a/b"
	s, err = buildSpec(cfg, tc, pc, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	segs := strings.Split(s.Report.MetricsKey, "/")
	if len(segs) != 7 || segs[0]+"/"+segs[1] != "ops/sweeps" || segs[2] != "default" || segs[4] != "trials" || segs[6] != "metrics" ||
		segs[3] == ".." || strings.HasPrefix(segs[3], ".") || segs[5] != "a~2Fb" {
		t.Errorf("metrics key %q is not ops/sweeps/default/<sweep>/trials/<trial>/metrics with one segment each", s.Report.MetricsKey)
	}
}

func TestBuildSpecTrialNeedsSweepAndTrial(t *testing.T) {
	for _, tc := range []TaskConfig{{Command: "x", Sweep: "s"}, {Command: "x", Trial: "t"}} {
		_, err := buildSpec(taskCfg(), &tc, pluginCfg(t), noEnv)
		if err == nil || !strings.Contains(err.Error(), "sweep and trial") {
			t.Errorf("sweep %q trial %q: error %v, want one naming both fields", tc.Sweep, tc.Trial, err)
		}
	}
}

func TestPluginConfigSweepKeyPrefix(t *testing.T) {
	cases := []struct {
		body    string
		want    string
		wantErr string
	}{
		{``, "gpujob/sweeps", ""},
		{`sweep_key_prefix = "ops/sweeps"`, "ops/sweeps", ""},
		{`sweep_key_prefix = "/gpujob/sweeps"`, "", "sweep_key_prefix"},
		{`sweep_key_prefix = "gpujob/sweeps/"`, "", "sweep_key_prefix"},
		{`sweep_key_prefix = "gpujob/rendezvous"`, "", "overlaps key_prefix"},
		{`sweep_key_prefix = "gpujob/rendezvous/sweeps"`, "", "overlaps key_prefix"},
		{"key_prefix = \"gpujob\"\nsweep_key_prefix = \"gpujob/sweeps\"", "", "overlaps key_prefix"},
		{`sweep_key_prefix = "gpujob/rendezvous-sweeps"`, "gpujob/rendezvous-sweeps", ""},
	}
	for _, c := range cases {
		cfg, err := decodePluginConfig(t, c.body)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%q: error %v, want one naming %q", c.body, err, c.wantErr)
			}
			continue
		}
		if err != nil || cfg.SweepKeyPrefix != c.want {
			t.Errorf("%q: sweep_key_prefix %q, %v; want %q", c.body, cfg.SweepKeyPrefix, err, c.want)
		}
	}
}

// A container member's supervisor reports and obeys like a host member's.
func TestContainerSpecKeepsTheTrial(t *testing.T) {
	s := &supervisor.Spec{Report: &supervisor.ReportSpec{MetricsKey: "a/m", StopKey: "a/s"}}
	containerSpec(s, "train", 0)
	if s.Report == nil || s.Report.MetricsKey != "a/m" {
		t.Fatalf("report %+v", s.Report)
	}
}
