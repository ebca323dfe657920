package render_test

import (
	"path"
	"reflect"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/hashicorp/nomad/helper/pluginutils/hclspecutils"
	"github.com/hashicorp/nomad/helper/pluginutils/hclutils"
	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/hashicorp/nomad/plugins/shared/hclspec"
	"github.com/zclconf/go-cty/cty"

	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/internal/containermember"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/safename"
)

func findTask(g *api.TaskGroup, name string) *api.Task {
	for _, t := range g.Tasks {
		if t.Name == name {
			return t
		}
	}
	return &api.Task{Name: name + " (missing)"}
}

// The runtime values a client interpolates into an image job's docker
// config, for dockerTaskConfig.
const (
	testAllocID   = "5b8a1c3e-1111-2222-3333-444455556666"
	testNamespace = "ml"
	testRun       = "1764490000"
)

// dockerSchema is the part of Nomad 1.6.3's docker driver task config
// schema (drivers/docker/config.go: taskConfigSpec, mountBodySpec) that a
// rendered image job uses, copied with its names and types. Importing the
// driver itself would pull the Docker client libraries into go.mod.
var dockerSchema = hclspec.NewObject(map[string]*hclspec.Spec{
	"image":      hclspec.NewAttr("image", "string", true),
	"entrypoint": hclspec.NewAttr("entrypoint", "list(string)", false),
	"command":    hclspec.NewAttr("command", "string", false),
	"args":       hclspec.NewAttr("args", "list(string)", false),
	"auth": hclspec.NewBlock("auth", false, hclspec.NewObject(map[string]*hclspec.Spec{
		"username":       hclspec.NewAttr("username", "string", false),
		"password":       hclspec.NewAttr("password", "string", false),
		"email":          hclspec.NewAttr("email", "string", false),
		"server_address": hclspec.NewAttr("server_address", "string", false),
	})),
	"force_pull": hclspec.NewAttr("force_pull", "bool", false),
	"init":       hclspec.NewAttr("init", "bool", false),
	"mount": hclspec.NewBlockList("mount", hclspec.NewObject(map[string]*hclspec.Spec{
		"type":     hclspec.NewDefault(hclspec.NewAttr("type", "string", false), hclspec.NewLiteral(`"volume"`)),
		"target":   hclspec.NewAttr("target", "string", false),
		"source":   hclspec.NewAttr("source", "string", false),
		"readonly": hclspec.NewAttr("readonly", "bool", false),
	})),
	"network_mode": hclspec.NewAttr("network_mode", "string", false),
	"image_pull_timeout": hclspec.NewDefault(hclspec.NewAttr("image_pull_timeout", "string", false),
		hclspec.NewLiteral(`"5m"`)),
	"shm_size":   hclspec.NewAttr("shm_size", "number", false),
	"pids_limit": hclspec.NewAttr("pids_limit", "number", false),
})

// dockerConfig and dockerMount are the fields of the docker driver's
// TaskConfig and DockerMount that dockerSchema decodes.
type dockerConfig struct {
	Image            string        `codec:"image"`
	Entrypoint       []string      `codec:"entrypoint"`
	Command          string        `codec:"command"`
	Args             []string      `codec:"args"`
	Auth             dockerAuth    `codec:"auth"`
	ForcePull        bool          `codec:"force_pull"`
	Init             bool          `codec:"init"`
	Mounts           []dockerMount `codec:"mount"`
	NetworkMode      string        `codec:"network_mode"`
	ImagePullTimeout string        `codec:"image_pull_timeout"`
	ShmSize          int64         `codec:"shm_size"`
	PidsLimit        int64         `codec:"pids_limit"`
}

type dockerAuth struct {
	Username   string `codec:"username"`
	Password   string `codec:"password"`
	Email      string `codec:"email"`
	ServerAddr string `codec:"server_address"`
}

type dockerMount struct {
	Type     string `codec:"type"`
	Target   string `codec:"target"`
	Source   string `codec:"source"`
	ReadOnly bool   `codec:"readonly"`
}

// runtimeVars are the variables a client interpolates into the task
// configs of job jobID.
func runtimeVars(jobID string, meta map[string]string) map[string]cty.Value {
	vars := map[string]cty.Value{
		"NOMAD_ALLOC_ID":    cty.StringVal(testAllocID),
		"NOMAD_ALLOC_INDEX": cty.StringVal("0"),
		"NOMAD_JOB_ID":      cty.StringVal(jobID),
		"NOMAD_NAMESPACE":   cty.StringVal(testNamespace),
	}
	for k, v := range meta {
		vars["NOMAD_META_"+k] = cty.StringVal(v)
	}
	return vars
}

// dockerTaskConfig decodes a task's config with dockerSchema, interpolating
// the runtime variables as the client does before it starts the task.
func dockerTaskConfig(t *testing.T, task *api.Task, jobID string, meta map[string]string) dockerConfig {
	t.Helper()
	var tc dockerConfig
	decodeTaskConfig(t, task, dockerSchema, runtimeVars(jobID, meta), &tc)
	return tc
}

// decodeTaskConfig decodes task's config with a driver's schema, as the
// Nomad client does (interpolation, then the driver's own decoding), into
// out.
func decodeTaskConfig(t *testing.T, task *api.Task, schema *hclspec.Spec, vars map[string]cty.Value, out any) {
	t.Helper()
	dec, diags := hclspecutils.Convert(schema)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	val, diags, errs := hclutils.ParseHclInterface(task.Config, dec, vars)
	if diags.HasErrors() || len(errs) > 0 {
		t.Fatalf("config of task %s: %v %v", task.Name, diags, errs)
	}
	dtc := &drivers.TaskConfig{}
	if err := dtc.EncodeDriverConfig(val); err != nil {
		t.Fatal(err)
	}
	if err := dtc.DecodeDriverConfig(out); err != nil {
		t.Fatal(err)
	}
}

// checkSidecar: an image job's gpujob task is a small prestart sidecar
// without GPUs or artifacts.
func checkSidecar(t *testing.T, task *api.Task) {
	t.Helper()
	if task.Driver != render.Driver {
		t.Errorf("sidecar %s: driver %q", task.Name, task.Driver)
	}
	if lc := task.Lifecycle; lc == nil || lc.Hook != "prestart" || !lc.Sidecar {
		t.Errorf("sidecar lifecycle %+v, want prestart sidecar", lc)
	}
	if r := task.Resources; r == nil || *r.CPU != spec.SidecarCPU || *r.MemoryMB != spec.SidecarMemoryMiB || len(r.Devices) != 0 {
		t.Errorf("sidecar resources %+v", r)
	}
	if len(task.Artifacts) != 0 {
		t.Errorf("sidecar artifacts %+v", task.Artifacts)
	}
	if task.KillTimeout == nil || *task.KillTimeout != render.KillTimeout {
		t.Errorf("sidecar kill_timeout %v", task.KillTimeout)
	}
}

// checkContainer: an image job's member task runs the supervisor in the
// spec's image on docker, with the run directory and the run's checkpoint
// directory (where the driver creates it) mounted.
func checkContainer(t *testing.T, tr *spec.Train, task *api.Task) {
	t.Helper()
	checkContainerAs(t, tr, task, tr.Name)
}

// checkContainerAs is checkContainer for the job run under the ID jobID.
func checkContainerAs(t *testing.T, tr *spec.Train, task *api.Task, jobID string) {
	t.Helper()
	if task.Driver != render.DockerDriver || task.Lifecycle != nil {
		t.Errorf("member task %s: driver %q lifecycle %+v", task.Name, task.Driver, task.Lifecycle)
	}
	for _, c := range []struct {
		run, want string
	}{
		{testRun, testRun}, // gpujob submit's stamp
		{"", ""},           // nomad job run of the rendered file
	} {
		dc := dockerTaskConfig(t, task, jobID, map[string]string{contract.MetaRun: c.run})
		if dc.Image != tr.Image || dc.Command != "" || len(dc.Args) != 0 ||
			!reflect.DeepEqual(dc.Entrypoint, []string{containermember.SupervisorPath(), containermember.SpecPath()}) ||
			dc.NetworkMode != "host" || !dc.Init {
			t.Errorf("docker config %+v", dc)
		}
		if dc.PidsLimit != render.ContainerPidsLimit {
			t.Errorf("pids_limit %d, want the driver's default %d", dc.PidsLimit, render.ContainerPidsLimit)
		}
		if dc.ShmSize != int64(tr.Resources.ShmMiB)<<20 {
			t.Errorf("shm_size %d, want %d MiB", dc.ShmSize, tr.Resources.ShmMiB)
		}
		// As the driver builds it (driver/spec.go: checkpointDir).
		ckpt := path.Join(contract.DefaultCheckpointRoot, safename.Encode(testNamespace), safename.Encode(jobID), c.want)
		want := []dockerMount{
			{Type: "bind", Source: path.Join(containermember.RunRoot, testAllocID), Target: containermember.MountPoint, ReadOnly: true},
			{Type: "bind", Source: ckpt, Target: ckpt},
		}
		got := make([]dockerMount, len(dc.Mounts))
		for i, m := range dc.Mounts {
			got[i] = dockerMount{Type: m.Type, Source: path.Clean(m.Source), Target: path.Clean(m.Target), ReadOnly: m.ReadOnly}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("run %q: mounts\n got %+v\nwant %+v", c.run, got, want)
		}
	}
}

// TestImageJobDecodes: an image job with every image_pull setting parses
// as Nomad parses it; its member's config decodes with the docker driver's
// schema and its sidecar's with the gpujob driver's.
func TestImageJobDecodes(t *testing.T) {
	tr := mustParse(t, imageSpec)
	src, err := render.Jobspec(tr)
	if err != nil {
		t.Fatal(err)
	}
	job := parseJob(t, "image.nomad.hcl", src)
	if job.Meta[contract.MetaRun] != "" || job.Meta[contract.MetaTask] != render.Task {
		t.Errorf("meta %v", job.Meta)
	}
	g := job.TaskGroups[0]
	if len(g.Tasks) != 2 {
		t.Fatalf("%d tasks", len(g.Tasks))
	}
	sidecar, member := findTask(g, render.Sidecar), findTask(g, render.Task)
	checkSidecar(t, sidecar)
	checkContainer(t, tr, member)
	// The rendered file run under another job ID (nomad job run after an
	// edit, the e2e tests) mounts that job's checkpoints.
	checkContainerAs(t, tr, member, "bert-2")
	tc := taskConfig(t, sidecar)
	if tc.ContainerTask != render.Task || tc.CheckpointRoot != contract.DefaultCheckpointRoot || tc.NProcPerNode != 2 ||
		!reflect.DeepEqual(tc.Preload, tr.Preload) || tc.Workdir != tr.Workdir {
		t.Errorf("sidecar config %+v", tc)
	}
	// The supervisor in the container plans its stop by the docker task's
	// kill_timeout, which only the sidecar's config can tell the driver.
	if kill, err := time.ParseDuration(tc.ContainerKillTimeout); err != nil || member.KillTimeout == nil || kill != *member.KillTimeout {
		t.Errorf("sidecar's container_kill_timeout %q (%v), want the docker task's kill_timeout %v", tc.ContainerKillTimeout, err, member.KillTimeout)
	}
	dc := dockerTaskConfig(t, member, tr.Name, map[string]string{contract.MetaRun: testRun})
	want := dockerAuth{Username: "robot", Password: "s3cret", ServerAddr: "registry.example.com"}
	if !dc.ForcePull || dc.ImagePullTimeout != "10m" || dc.Auth != want || dc.ShmSize != 1<<30 {
		t.Errorf("docker config %+v", dc)
	}
	if len(member.Artifacts) != 1 || *member.Artifacts[0].GetterSource != tr.Artifacts[0].Source {
		t.Errorf("artifacts %+v", member.Artifacts)
	}
	if r := member.Resources; *r.CPU != 4000 || *r.MemoryMB != 4096 || len(r.Devices) != 1 || *r.Devices[0].Count != 2 {
		t.Errorf("member resources %+v", r)
	}
}
