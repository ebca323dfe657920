package nomadapi

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
)

func strp(s string) *string { return &s }

func TestFakeJobsAndNotFound(t *testing.T) {
	f := NewFake()
	f.SetJob(&api.Job{ID: strp("a"), Meta: map[string]string{"gpujob": "train"}})
	f.SetJob(&api.Job{ID: strp("b")})
	if _, err := f.Job("zzz"); err == nil || !strings.Contains(err.Error(), "Unexpected response code: 404") {
		t.Errorf("missing job: %v", err)
	}
	stubs, meta, err := f.Jobs(nil)
	if err != nil || len(stubs) != 2 || stubs[0].Meta != nil || meta.LastIndex == 0 {
		t.Errorf("Jobs without meta: %+v %v", stubs, err)
	}
	stubs, _, _ = f.Jobs(&api.QueryOptions{Params: map[string]string{"meta": "true"}, Prefix: "a"})
	if len(stubs) != 1 || stubs[0].Meta["gpujob"] != "train" || stubs[0].Name != "a" {
		t.Errorf("Jobs with meta and prefix: %+v", stubs)
	}
	// copies: changing what was returned changes nothing
	j, _ := f.Job("a")
	j.Meta["gpujob"] = "x"
	if j2, _ := f.Job("a"); j2.Meta["gpujob"] != "train" {
		t.Error("Job returned the stored job, not a copy")
	}
}

func TestFakeBlockingQuery(t *testing.T) {
	f := NewFake()
	f.SetAlloc(&api.Allocation{ID: "a", JobID: "j", ClientStatus: "running"})
	_, meta, _ := f.JobAllocations("j", nil)

	// OnBlock scripts the change
	f.OnBlock = func(f *Fake, q string, _ uint64) {
		f.UpdateAlloc("a", func(a *api.Allocation) { a.ClientStatus = "complete" })
	}
	stubs, meta2, _ := f.JobAllocations("j", &api.QueryOptions{WaitIndex: meta.LastIndex})
	if meta2.LastIndex <= meta.LastIndex || stubs[0].ClientStatus != "complete" || len(f.BlockingQuerys) != 1 {
		t.Errorf("blocking query: %+v %+v %v", meta2, stubs[0], f.BlockingQuerys)
	}

	// WaitTime bounds a wait without a change
	f.OnBlock = nil
	start := time.Now()
	_, meta3, _ := f.JobAllocations("j", &api.QueryOptions{WaitIndex: meta2.LastIndex, WaitTime: 20 * time.Millisecond})
	if meta3.LastIndex != meta2.LastIndex || time.Since(start) < 20*time.Millisecond {
		t.Errorf("WaitTime: %+v after %v", meta3, time.Since(start))
	}

	// a change from another goroutine wakes the query
	go f.Bump()
	_, meta4, _ := f.JobAllocations("j", &api.QueryOptions{WaitIndex: meta3.LastIndex})
	if meta4.LastIndex <= meta3.LastIndex {
		t.Errorf("woken query: %+v", meta4)
	}
}

func TestFakeLogs(t *testing.T) {
	f := NewFake()
	a := &api.Allocation{ID: "a"}
	f.SetLog("a", "train", "stdout", "one\n", "two")
	read := func(follow bool, cancel chan struct{}) string {
		frames, errs := f.Logs(a, "train", "stdout", follow, cancel)
		var b strings.Builder
		for {
			select {
			case fr, ok := <-frames:
				if !ok {
					return b.String()
				}
				b.Write(fr.Data)
			case err := <-errs:
				return "error: " + err.Error()
			}
		}
	}
	if got := read(false, nil); got != "one\ntwo" {
		t.Errorf("no follow: %q", got)
	}
	done := make(chan string)
	go func() { done <- read(true, nil) }()
	f.AppendLog("a", "train", "stdout", "\nthree\n")
	f.CloseLog("a", "train", "stdout")
	if got := <-done; got != "one\ntwo\nthree\n" {
		t.Errorf("follow: %q", got)
	}
	f.SetLogError("a", "train", "stderr", errTest("task not started yet"))
	frames, errs := f.Logs(a, "train", "stderr", true, nil)
	if frames != nil || (<-errs).Error() != "task not started yet" {
		t.Error("log error")
	}
	// cancel ends a follow
	cancel := make(chan struct{})
	go func() { done <- read(true, cancel) }()
	close(cancel)
	<-done
}

type errTest string

func (e errTest) Error() string { return string(e) }

func TestFakeDeregister(t *testing.T) {
	f := NewFake()
	f.SetJob(&api.Job{ID: strp("j")})
	f.SetAlloc(&api.Allocation{ID: "a", JobID: "j", ClientStatus: "running", TaskGroup: "train"})
	called := false
	f.OnDeregister = func(f *Fake, id string, purge bool) { called = id == "j" && !purge }
	if _, err := f.Deregister("j", false); err != nil || !called {
		t.Fatal(err)
	}
	j, _ := f.Job("j")
	a, _ := f.Allocation("a")
	if !*j.Stop || *j.Status != "dead" || a.DesiredStatus != "stop" {
		t.Errorf("after deregister: job %+v alloc %+v", j, a)
	}
	sum, _ := f.JobSummary("j")
	if sum.Summary["train"].Running != 1 {
		t.Errorf("summary: %+v", sum)
	}
	if _, err := f.Deregister("j", true); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Job("j"); err == nil {
		t.Error("purged job still there")
	}
	if _, err := f.Deregister("j", true); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("deregistering a missing job: %v", err)
	}
	if len(f.Deregistered) != 2 {
		t.Errorf("recorded: %+v", f.Deregistered)
	}
}

func TestFakeNodes(t *testing.T) {
	f := NewFake()
	f.SetNode(&api.Node{ID: "n1", Name: "one", Status: "ready", NodeResources: &api.NodeResources{
		Devices: []*api.NodeDeviceResource{{Vendor: "nvidia", Type: "gpu", Name: "T4"}}}})
	stubs, _, _ := f.Nodes(nil)
	if len(stubs) != 1 || stubs[0].Name != "one" || stubs[0].NodeResources != nil {
		t.Errorf("Nodes: %+v", stubs)
	}
	stubs, _, _ = f.Nodes(&api.QueryOptions{Params: map[string]string{"resources": "true"}})
	if stubs[0].NodeResources == nil || stubs[0].NodeResources.Devices[0].Name != "T4" {
		t.Errorf("Nodes with resources: %+v", stubs[0])
	}
	if _, err := f.NodeStats("n1"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("NodeStats of a node without stats: %v", err)
	}
}
