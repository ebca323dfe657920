package sweepjob

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/sweep/controller"
	"github.com/gpujob/gpujob/internal/sweep/search"
)

func template() *api.Job {
	id := "toy"
	return &api.Job{ID: &id, Name: &id, Meta: map[string]string{contract.MetaTrial: trialToken},
		TaskGroups: []*api.TaskGroup{{Tasks: []*api.Task{{Name: "train", Config: map[string]any{
			"args": []any{"--lr", paramToken("lr")}, "trial": trialToken}}}}}}
}

func TestLaunchIsCreateOnly(t *testing.T) {
	f := nomadapi.NewFake()
	l := &Launcher{Nomad: f, Template: template(), Sweep: "toy", Run: "100"}
	tr := controller.Trial{ID: "trial-001", JobID: "toy-trial-001", Params: search.Assignment{"lr": search.FloatValue(0.5)}}
	for i := 0; i < 3; i++ {
		if err := l.Launch(context.Background(), tr); err != nil {
			t.Fatalf("launch %d: %v", i, err)
		}
	}
	if len(f.Registered) != 1 {
		t.Fatalf("registered %d times, want once", len(f.Registered))
	}
	job := f.Registered[0]
	if *job.ID != "toy-trial-001" || job.Meta[contract.MetaRun] != "100" || job.Meta[contract.MetaTrial] != "trial-001" {
		t.Errorf("job %s meta %v", *job.ID, job.Meta)
	}
	if args := job.TaskGroups[0].Tasks[0].Config["args"].([]any); args[1] != "0.5" {
		t.Errorf("args %v", args)
	}

	// A job of that ID from another submission of the sweep is refused.
	other := &Launcher{Nomad: f, Template: template(), Sweep: "toy", Run: "200"}
	err := other.Launch(context.Background(), tr)
	if !errors.Is(err, controller.ErrRefused) || !strings.Contains(err.Error(), "another submission") {
		t.Fatalf("want a refusal naming the other submission, got %v", err)
	}
}

func TestPhase(t *testing.T) {
	sum := func(running, failed, lost, queued int) *api.JobSummary {
		return &api.JobSummary{Summary: map[string]api.TaskGroupSummary{"train": {Running: running, Failed: failed, Lost: lost, Queued: queued}}}
	}
	for _, tc := range []struct {
		name string
		stub api.JobListStub
		want controller.JobPhase
	}{
		{"queued", api.JobListStub{Status: "pending", JobSummary: sum(0, 0, 0, 1)}, controller.JobQueued},
		{"running", api.JobListStub{Status: "running", JobSummary: sum(1, 0, 0, 0)}, controller.JobRunning},
		{"complete", api.JobListStub{Status: "dead", JobSummary: sum(0, 0, 0, 0)}, controller.JobComplete},
		{"failed", api.JobListStub{Status: "dead", JobSummary: sum(0, 1, 0, 0)}, controller.JobFailed},
		{"lost counts as failed until settled", api.JobListStub{Status: "dead", JobSummary: sum(0, 0, 1, 0)}, controller.JobFailed},
		{"stopped", api.JobListStub{Status: "dead", Stop: true, JobSummary: sum(0, 1, 0, 0)}, controller.JobStopped},
	} {
		if got := phase(&tc.stub).Phase; got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

func TestSettleLooksAtTheLatestAllocationOfEachMember(t *testing.T) {
	f := nomadapi.NewFake()
	id := "toy-trial-001"
	f.SetJob(&api.Job{ID: &id, Name: &id})
	f.SetAlloc(&api.Allocation{ID: "a1", JobID: id, Name: "toy-trial-001.train[0]", ClientStatus: "lost", CreateIndex: 10})
	f.SetAlloc(&api.Allocation{ID: "a2", JobID: id, Name: "toy-trial-001.train[0]", ClientStatus: "complete", CreateIndex: 20})
	l := &Launcher{Nomad: f, Sweep: "toy"}
	if o, _ := l.settle(id, controller.JobObservation{Phase: controller.JobFailed}); o.Phase != controller.JobComplete {
		t.Errorf("a lost allocation whose replacement completed: %s", o.Phase)
	}
	f.SetAlloc(&api.Allocation{ID: "a3", JobID: id, Name: "toy-trial-001.train[1]", ClientStatus: "failed", CreateIndex: 30})
	if o, _ := l.settle(id, controller.JobObservation{Phase: controller.JobFailed}); o.Phase != controller.JobFailed || o.Reason == "" {
		t.Errorf("a member whose latest allocation failed: %+v", o)
	}
}

// The launcher registers and stops nothing but the sweep's own trial jobs,
// whatever job ID a trial of the state carries: a forged state in Consul
// must not make the controller's token stop or create another job.
func TestLauncherActsOnlyOnItsTrialJobs(t *testing.T) {
	f := nomadapi.NewFake()
	l := &Launcher{Nomad: f, Template: template(), Sweep: "toy", Run: "100"}
	for _, tr := range []controller.Trial{
		{ID: "trial-001", Index: 0, JobID: "payments-api"},
		{ID: "trial-002", Index: 0, JobID: "toy-trial-002"},
		{ID: "trial-001", Index: 0, JobID: "toy-x-trial-001"},
	} {
		tr.Params = search.Assignment{"lr": search.FloatValue(0.5)}
		if err := l.Launch(context.Background(), tr); !errors.Is(err, controller.ErrRefused) {
			t.Errorf("launching %+v: %v, want a refusal", tr, err)
		}
	}
	for _, id := range []string{"payments-api", "toy-trial-", "toy-trial-01", "toy-trial-001x", "toyx-trial-001", "other-trial-001"} {
		if err := l.StopJob(context.Background(), id); !errors.Is(err, controller.ErrRefused) {
			t.Errorf("stopping %q: %v, want a refusal", id, err)
		}
	}
	if len(f.Registered) != 0 || len(f.Deregistered) != 0 {
		t.Errorf("registered %d, deregistered %v", len(f.Registered), f.Deregistered)
	}
	own := controller.Trial{ID: "trial-001", JobID: "toy-trial-001", Params: search.Assignment{"lr": search.FloatValue(0.5)}}
	if err := l.Launch(context.Background(), own); err != nil {
		t.Fatal(err)
	}
	if err := l.StopJob(context.Background(), "toy-trial-001"); err != nil || len(f.Deregistered) != 1 {
		t.Errorf("stopping its own trial job: %v, %v", err, f.Deregistered)
	}
}
