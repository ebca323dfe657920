package servicedeploy

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/internal/contract"
)

// serviceJob is a service's job as deploy registers it: its kind and
// version in the meta, its replica group with count and bounds.
func serviceJob(name, version string, count int, lo, hi int64) *api.Job {
	group := render.ServiceGroup
	return &api.Job{ID: &name, Name: &name,
		Meta:       map[string]string{contract.MetaKind: contract.KindService, contract.MetaVersion: version},
		TaskGroups: []*api.TaskGroup{{Name: &group, Count: &count, Scaling: &api.ScalingPolicy{Min: &lo, Max: &hi}}}}
}

func TestLoadRefusesWhatIsNoService(t *testing.T) {
	fake := nomadapi.NewFake()
	id := "batch"
	fake.SetJob(&api.Job{ID: &id, Name: &id, Meta: map[string]string{contract.MetaKind: contract.KindTrain}})
	if _, err := Load(fake, "batch"); err == nil || !strings.Contains(err.Error(), "is not a gpujob service") {
		t.Errorf("a training job: %v", err)
	}
	if _, err := Load(fake, "gone"); !errors.Is(err, ErrNoService) {
		t.Errorf("no job: %v, want ErrNoService", err)
	}
}

func TestScale(t *testing.T) {
	fake := nomadapi.NewFake()
	if _, err := fake.Register(serviceJob("bert", "v1", 2, 1, 4)); err != nil {
		t.Fatal(err)
	}
	if _, err := Scale(fake, "bert", 5); err == nil || !strings.Contains(err.Error(), "runs 1 to 4 replicas") {
		t.Errorf("above max: %v", err)
	}
	sc, err := Scale(fake, "bert", 2)
	if err != nil || sc.EvalID != "" || sc.Was != 2 {
		t.Errorf("the same count: %+v %v; want nothing asked of Nomad", sc, err)
	}
	sc, err = Scale(fake, "bert", 3)
	if err != nil || sc.EvalID == "" || sc.Was != 2 || sc.Count != 3 {
		t.Fatalf("scale to 3: %+v %v", sc, err)
	}
	if j, _ := fake.Job("bert"); *Group(j).Count != 3 {
		t.Errorf("count %d, want 3", *Group(j).Count)
	}
	if _, err := Scale(fake, "gone", 1); !errors.Is(err, ErrNoService) {
		t.Errorf("no such service: %v", err)
	}
}

func TestLogsPrefixesEachReplica(t *testing.T) {
	fake := nomadapi.NewFake()
	if _, err := fake.Register(serviceJob("bert", "v1", 2, 1, 4)); err != nil {
		t.Fatal(err)
	}
	for i, id := range []string{"bbbbbbbb-0000-0000-0000-000000000000", "aaaaaaaa-0000-0000-0000-000000000000"} {
		name := "bert.replica[" + string(rune('0'+i)) + "]"
		fake.SetAlloc(&api.Allocation{ID: id, Name: name, JobID: "bert", ClientStatus: api.AllocClientStatusRunning})
		fake.SetLog(id, render.ServiceTask, "stdout", "loaded "+name+"\nserving\npartial")
	}
	fake.SetAlloc(&api.Allocation{ID: "cccccccc-dead", Name: "bert.replica[2]", JobID: "bert", ClientStatus: api.AllocClientStatusComplete})
	var out bytes.Buffer
	if err := Logs(context.Background(), fake, &out, LogsRequest{Name: "bert", Stream: "stdout"}); err != nil {
		t.Fatal(err)
	}
	want := "[bert.replica[0] v1] loaded bert.replica[0]\n[bert.replica[0] v1] serving\n[bert.replica[0] v1] partial\n" +
		"[bert.replica[1] v1] loaded bert.replica[1]\n[bert.replica[1] v1] serving\n[bert.replica[1] v1] partial\n"
	if out.String() != want {
		t.Errorf("logs:\n%s\nwant:\n%s", out.String(), want)
	}
	err := Logs(context.Background(), fake, &out, LogsRequest{Name: "bert", AllocPrefix: "cccc", Stream: "stdout"})
	if err == nil || !strings.Contains(err.Error(), "no running replica with allocation ID cccc") {
		t.Errorf("a stopped replica picked: %v", err)
	}
}

func TestTallyCountsReplicasByVersionAndHealth(t *testing.T) {
	alloc := func(id, name, status string, jobVersion uint64) *api.AllocationListStub {
		return &api.AllocationListStub{ID: id, Name: name, ClientStatus: status, JobVersion: jobVersion}
	}
	id := func(c byte) string { return strings.Repeat(string(c), 36) }
	stubs := []*api.AllocationListStub{
		alloc(id('b'), "s[1]", api.AllocClientStatusRunning, 1),
		alloc(id('a'), "s[0]", api.AllocClientStatusRunning, 0),
		alloc(id('c'), "s[2]", api.AllocClientStatusPending, 1),
		alloc(id('d'), "s[3]", api.AllocClientStatusComplete, 0),
	}
	health := healthByAlloc([]*consul.ServiceEntry{
		{Node: &consul.Node{Address: "10.0.0.1"}, Service: &consul.AgentService{ID: "_nomad-task-" + id('a') + "-serve-s-http", Port: 8001},
			Checks: consul.HealthChecks{{Status: consul.HealthPassing}}},
		{Node: &consul.Node{Address: "10.0.0.2"}, Service: &consul.AgentService{ID: "_nomad-task-" + id('b') + "-serve-s-http", Port: 8002,
			Address: "10.9.9.9", Tags: []string{render.TagCanary}}, Checks: consul.HealthChecks{{Status: consul.HealthCritical}}},
		{Node: &consul.Node{}, Service: &consul.AgentService{ID: "not-nomads"}},
	})
	st := &Status{}
	tally(st, stubs, map[uint64]string{0: "v1", 1: "v2"}, health)
	if len(st.Replicas) != 3 || st.Replicas[0].Name != "s[0]" || st.Replicas[0].Address != "10.0.0.1:8001" ||
		!st.Replicas[1].Canary || st.Replicas[1].Address != "10.9.9.9:8002" || st.Replicas[1].Health != consul.HealthCritical {
		t.Errorf("replicas: %+v", st.Replicas)
	}
	want := []VersionCount{{Version: "v1", Running: 1, Healthy: 1}, {Version: "v2", Running: 1, Healthy: 0}}
	if st.Healthy != 1 || len(st.Versions) != 2 || st.Versions[0] != want[0] || st.Versions[1] != want[1] {
		t.Errorf("healthy %d, versions %+v; want 1, %+v", st.Healthy, st.Versions, want)
	}
}

func TestRollbackTarget(t *testing.T) {
	job := func(v uint64, label string, stable bool) *api.Job {
		return &api.Job{Version: &v, Stable: &stable, Meta: map[string]string{contract.MetaVersion: label}}
	}
	versions := []*api.Job{job(4, "v3", false), job(3, "v2", true), job(2, "v2", true), job(1, "v1", true)}
	for _, c := range []struct {
		to      int64
		want    uint64
		wantErr string
	}{
		{-1, 3, ""},
		{1, 1, ""},
		{4, 0, "is the current one"},
		{9, 0, "no job version 9"},
	} {
		got, err := RollbackTarget(versions, c.to)
		switch {
		case c.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("to %d: err %v, want %q", c.to, err, c.wantErr)
			}
		case err != nil || *got.Version != c.want:
			t.Errorf("to %d: got %v %v, want version %d", c.to, got, err, c.want)
		}
	}
	// Only unstable or same-label versions: nothing to go back to.
	if _, err := RollbackTarget([]*api.Job{job(2, "v2", true), job(1, "v2", true), job(0, "v1", false)}, -1); err == nil {
		t.Error("found a target among same-label and unstable versions")
	}
}
