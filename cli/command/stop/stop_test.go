package stop

import (
	"errors"
	"strings"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/gpujobs/fixture"
	"github.com/gpujob/gpujob/cli/nomadapi"
)

func execute(t *testing.T, f *nomadapi.Fake, args ...string) (string, error) {
	t.Helper()
	out, _, err := fixture.Execute(NewCmd, f, args...)
	return out, err
}

func running() *nomadapi.Fake {
	f := nomadapi.NewFake()
	job := fixture.TrainJob("bert", 2, 1)
	f.SetJob(job)
	n := fixture.Node("n1", "node-1", "Tesla T4", 15360, true)
	f.SetAlloc(fixture.Alloc(job, "a0000000", 0, n, "running", nil))
	f.SetAlloc(fixture.Alloc(job, "a1111111", 1, n, "running", nil))
	f.SetAlloc(fixture.Alloc(job, "old00000", 1, n, "failed", nil))
	// the Nomad client stops one allocation per blocking query
	f.OnBlock = func(f *nomadapi.Fake, query string, _ uint64) {
		for _, id := range []string{"a0000000", "a1111111"} {
			a, _ := f.Allocation(id)
			if a.DesiredStatus == "stop" && a.ClientStatus == "running" {
				f.UpdateAlloc(id, func(a *api.Allocation) { a.ClientStatus = "complete" })
				return
			}
		}
	}
	return f
}

func TestStop(t *testing.T) {
	tests := []struct {
		name      string
		args      []string
		purge     bool
		want      []string
		jobLeft   bool
		blockings int
	}{
		{
			name: "stop and wait",
			args: []string{"bert"},
			want: []string{
				"Job bert stopped (evaluation 00000001).",
				"Waiting for 2 allocation(s) to stop…",
				"  bert.train[0] (a0000000) on node-1: complete (1 still running)",
				"  bert.train[1] (a1111111) on node-1: complete (0 still running)",
				"All allocations stopped.",
			},
			jobLeft: true, blockings: 2,
		},
		{
			name:  "purge",
			args:  []string{"--purge", "bert"},
			purge: true,
			want:  []string{"Job bert stopped and purged (evaluation 00000001).", "All allocations stopped."},
			// the allocations outlive the purged job until GC
			blockings: 2,
		},
		{
			name:      "detach",
			args:      []string{"bert", "--detach"},
			want:      []string{"Job bert stopped (evaluation 00000001).", "Not waiting for its allocations (--detach): gpujob status bert"},
			jobLeft:   true,
			blockings: 0,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := running()
			out, err := execute(t, f, tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.want {
				if !strings.Contains(out, w+"\n") {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			if len(f.Deregistered) != 1 || f.Deregistered[0] != (nomadapi.Deregistration{JobID: "bert", Purge: tt.purge}) {
				t.Errorf("deregistrations: %+v", f.Deregistered)
			}
			_, err = f.Job("bert")
			if (err == nil) != tt.jobLeft {
				t.Errorf("job left = %v, want %v", err == nil, tt.jobLeft)
			}
			if len(f.BlockingQuerys) != tt.blockings {
				t.Errorf("blocking queries: %v, want %d", f.BlockingQuerys, tt.blockings)
			}
			for _, q := range f.BlockingQuerys {
				if q != "JobAllocations" {
					t.Errorf("unexpected blocking query %s", q)
				}
			}
		})
	}
}

func TestStopNothingRunning(t *testing.T) {
	f := nomadapi.NewFake()
	job := fixture.TrainJob("done", 1, 1)
	f.SetJob(job)
	f.SetAlloc(fixture.Alloc(job, "a", 0, nil, "complete", nil))
	out, err := execute(t, f, "done")
	if err != nil || !strings.Contains(out, "No allocation is running.") {
		t.Errorf("%v\n%s", err, out)
	}
}

func TestStopErrors(t *testing.T) {
	f := nomadapi.NewFake()
	if _, err := execute(t, f, "nope"); err == nil || err.Error() != `job "nope" not found` {
		t.Errorf("missing job: %v", err)
	}
	id := "web"
	f.SetJob(&api.Job{ID: &id})
	if _, err := execute(t, f, "web"); err == nil || !strings.Contains(err.Error(), "not a gpujob training job") {
		t.Errorf("non-gpujob job: %v", err)
	}
	if len(f.Deregistered) != 0 {
		t.Errorf("deregistered: %+v", f.Deregistered)
	}
	f = running()
	f.Fail("Deregister", errors.New("stopping job bert: Nomad at http://x refused the request: check NOMAD_TOKEN"))
	if _, err := execute(t, f, "bert"); err == nil || !strings.Contains(err.Error(), "check NOMAD_TOKEN") {
		t.Errorf("agent error: %v", err)
	}
}
