package admit

import (
	"encoding/json"
	"strings"
	"testing"

	nomadapi "github.com/hashicorp/nomad/api"
)

// The controller registers with its own token: a record whose job asks
// for what the submitter's token could not grant, or for what gpujob
// never renders, is refused with the reason and never planned.
func TestPrivilegedJobsAreRefused(t *testing.T) {
	f := newFixture(t, 2, 4)
	f.lead(f.c)
	cases := map[string]struct {
		edit func(j *nomadapi.Job)
		want string
	}{
		"pool":     {func(j *nomadapi.Job) { j.NodePool = ptr("gpu") }, "default node pool for now"},
		"multi":    {func(j *nomadapi.Job) { j.Multiregion = &nomadapi.Multiregion{} }, "multiregion"},
		"periodic": {func(j *nomadapi.Job) { j.Periodic = &nomadapi.PeriodicConfig{Spec: ptr("* * * * *")} }, "periodic"},
		"param":    {func(j *nomadapi.Job) { j.ParameterizedJob = &nomadapi.ParameterizedJobConfig{} }, "parameterized"},
		"consul":   {func(j *nomadapi.Job) { j.ConsulToken = ptr("secret") }, "may not carry credentials"},
		"vault":    {func(j *nomadapi.Job) { j.VaultToken = ptr("secret") }, "may not carry credentials"},
		"region":   {func(j *nomadapi.Job) { j.Region = ptr("eu") }, `region "eu"`},
		"priority": {func(j *nomadapi.Job) { j.Priority = ptr(1000) }, "priority 1000"},
		"hostvol": {func(j *nomadapi.Job) {
			j.TaskGroups[0].Volumes = map[string]*nomadapi.VolumeRequest{"v": {Type: "host", Source: "root"}}
		}, "volumes"},
		"csivol": {func(j *nomadapi.Job) {
			j.TaskGroups[0].Volumes = map[string]*nomadapi.VolumeRequest{"v": {Type: "csi", Source: "x"}}
		}, "volumes"},
		"mount": {func(j *nomadapi.Job) {
			j.TaskGroups[0].Tasks[0].VolumeMounts = []*nomadapi.VolumeMount{{Volume: ptr("v")}}
		}, "volume_mount"},
		"raw":       {func(j *nomadapi.Job) { j.TaskGroups[0].Tasks[0].Driver = "raw_exec" }, `driver "raw_exec"`},
		"vaultblk":  {func(j *nomadapi.Job) { j.TaskGroups[0].Tasks[0].Vault = &nomadapi.Vault{Policies: []string{"root"}} }, "vault block"},
		"template":  {func(j *nomadapi.Job) { j.TaskGroups[0].Tasks[0].Templates = []*nomadapi.Template{{}} }, "templates"},
		"csiplugin": {func(j *nomadapi.Job) { j.TaskGroups[0].Tasks[0].CSIPluginConfig = &nomadapi.TaskCSIPluginConfig{} }, "CSI plugin"},
	}
	for id, c := range cases {
		j := jobOf("default", id, "", 1, 1)
		c.edit(j)
		r := recordOf(j, 0, t0)
		if _, err := r.Check(t0); id != "region" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: Check: %v, want %q", id, err, c.want)
		}
		b, _ := json.Marshal(r)
		f.put(JobKey(f.c.jobsPrefix(), "default", id), b)
	}
	// Allowed: the default pool named, the controller's region, a docker
	// member beside the gpujob sidecar.
	ok := jobOf("default", "fine", "", 1, 1)
	ok.NodePool, ok.Region, ok.Priority = ptr("default"), ptr("global"), ptr(70)
	ok.TaskGroups[0].Tasks = append(ok.TaskGroups[0].Tasks, &nomadapi.Task{Name: "member", Driver: "docker"})
	f.submit(recordOf(ok, 0, t0))
	f.reconcile(f.c)
	for id, c := range cases {
		st := f.status("default/" + id)
		if st == nil || st.State != StateRefused || !strings.Contains(st.Reason, c.want) {
			t.Errorf("%s: status %+v, want refused with %q", id, st, c.want)
		}
		if f.nomad.registered("default/"+id) != 0 {
			t.Errorf("%s registered", id)
		}
	}
	if st := f.status("default/fine"); st == nil || st.State != StateAdmitted {
		t.Errorf("an allowed job: %+v", st)
	}
}

// A plan that places the job only through Nomad's own preemption (by job
// priority) is not registered: it would evict members of other gangs.
func TestPlanThatEvictsIsNotRegistered(t *testing.T) {
	plan := &nomadapi.JobPlanResponse{Annotations: &nomadapi.PlanAnnotations{PreemptedAllocs: []*nomadapi.AllocationListStub{{ID: "a"}, {ID: "b"}}}}
	if why := unplaced(plan, 2); !strings.Contains(why, "evicting 2 allocations") {
		t.Errorf("unplaced: %q", why)
	}
}
