package list

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/gpujobs/fixture"
	"github.com/gpujob/gpujob/cli/nomadapi"
)

func execute(t *testing.T, f *nomadapi.Fake, args ...string) (string, error) {
	t.Helper()
	out, _, err := fixture.Execute(NewCmd, f, args...)
	return out, err
}

func cluster() *nomadapi.Fake {
	f := nomadapi.NewFake()
	bert := fixture.TrainJob("bert", 2, 1) // submitted 10m ago, running
	f.SetJob(bert)
	f.SetAlloc(fixture.Alloc(bert, "b0", 0, nil, "running", nil))
	f.SetAlloc(fixture.Alloc(bert, "b1", 1, nil, "running", nil))

	old := fixture.TrainJob("resnet", 4, 2) // done 3 days ago; one member replaced
	submit := fixture.Epoch.Add(-72 * time.Hour).UnixNano()
	dead := "dead"
	old.SubmitTime, old.Status = &submit, &dead
	f.SetJob(old)
	for i, st := range []string{"complete", "complete", "complete", "failed", "complete"} {
		f.SetAlloc(fixture.Alloc(old, "r"+string(rune('0'+i)), min(i, 3), nil, st, nil))
	}

	web := api.NewServiceJob("web", "web", "global", 50) // not gpujob's
	web.Meta = map[string]string{"team": "x"}
	f.SetJob(web)
	plain := api.NewBatchJob("plain", "plain", "global", 50) // no meta at all
	f.SetJob(plain)
	return f
}

func TestList(t *testing.T) {
	out, err := execute(t, cluster())
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 {
		t.Fatalf("want a header and 2 rows:\n%s", out)
	}
	if got := strings.Fields(lines[0]); strings.Join(got, " ") != "NAME STATE WORKERS GPUS/WORKER SUBMITTED PENDING RUNNING COMPLETE FAILED LOST" {
		t.Errorf("header: %q", lines[0])
	}
	if got := strings.Join(strings.Fields(lines[1]), " "); got != "bert running 2 1 10m ago 0 2 0 0 0" {
		t.Errorf("row 1: %q", got)
	}
	if got := strings.Join(strings.Fields(lines[2]), " "); got != "resnet complete 4 2 3d ago 0 0 4 1 0" {
		t.Errorf("row 2: %q", got)
	}
	if strings.Contains(out, "web") || strings.Contains(out, "plain") {
		t.Errorf("non-gpujob jobs listed:\n%s", out)
	}
}

func TestListJSON(t *testing.T) {
	out, err := execute(t, cluster(), "--json")
	if err != nil {
		t.Fatal(err)
	}
	var jobs []Job
	if err := json.Unmarshal([]byte(out), &jobs); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(jobs) != 2 || jobs[0].Name != "bert" || jobs[0].Workers != 2 || jobs[0].GPUsPerWorker != 1 ||
		jobs[0].Counts.Running != 2 || !jobs[0].Submitted.Equal(fixture.Epoch.Add(-10*time.Minute)) ||
		jobs[1].State != "complete" || jobs[1].NomadStatus != "dead" {
		t.Errorf("jobs: %+v", jobs)
	}
	var raw []map[string]any
	_ = json.Unmarshal([]byte(out), &raw)
	for _, k := range []string{"name", "namespace", "state", "nomad_status", "workers", "gpus_per_worker", "submitted", "counts"} {
		if _, ok := raw[0][k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
}

func TestListEmptyAndStates(t *testing.T) {
	f := nomadapi.NewFake()
	out, err := execute(t, f)
	if err != nil || out != "No training jobs.\n" {
		t.Errorf("%v %q", err, out)
	}
	out, err = execute(t, f, "--json")
	if err != nil || strings.TrimSpace(out) != "[]" {
		t.Errorf("%v %q", err, out)
	}
	for _, tt := range []struct {
		stub    api.JobListStub
		c       struct{ run, complete, failed int }
		workers int
		want    string
	}{
		{api.JobListStub{Stop: true, Status: "dead"}, struct{ run, complete, failed int }{0, 2, 0}, 2, "stopped"},
		{api.JobListStub{Status: "dead"}, struct{ run, complete, failed int }{0, 1, 1}, 2, "failed"},
		{api.JobListStub{Status: "running"}, struct{ run, complete, failed int }{0, 0, 0}, 2, "pending"},
		{api.JobListStub{Status: "pending"}, struct{ run, complete, failed int }{}, 2, "pending"},
	} {
		c := tt.c
		got := state(&tt.stub, countsOf(c.run, c.complete, c.failed), tt.workers)
		if got != tt.want {
			t.Errorf("state(%+v, %+v) = %q, want %q", tt.stub, c, got, tt.want)
		}
	}
}

func countsOf(run, complete, failed int) (c gpujobs.Counts) {
	c.Running, c.Complete, c.Failed = run, complete, failed
	return c
}
