package render_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/driver"
	"github.com/gpujob/gpujob/internal/contract"
)

// parseJob reads a jobspec the way `nomad job run` does: Nomad 1.6.3's own
// HCL2 parser, behind the agent's /v1/jobs/parse.
func parseJob(t *testing.T, path string, src []byte) *api.Job {
	t.Helper()
	client, err := api.NewClient(&api.Config{Address: needAgent(t)})
	if err != nil {
		t.Fatal(err)
	}
	job, err := client.Jobs().ParseHCLOpts(&api.JobsParseRequest{JobHCL: string(src)})
	if err != nil {
		t.Fatalf("nomad parse %s: %v", path, err)
	}
	return job
}

// taskConfig decodes a task's config with the gpujob driver's own schema,
// as the Nomad client does before it starts the task. `nomad job validate`
// cannot check this: the server does not know the driver.
func taskConfig(t *testing.T, task *api.Task) driver.TaskConfig {
	t.Helper()
	d := driver.New(hclog.NewNullLogger(), "")
	defer d.Shutdown()
	schema, err := d.TaskConfigSchema()
	if err != nil {
		t.Fatal(err)
	}
	var tc driver.TaskConfig
	decodeTaskConfig(t, task, schema, runtimeVars("job", nil), &tc)
	return tc
}

func envOf(tc driver.TaskConfig) map[string]string {
	out := map[string]string{}
	for _, m := range tc.Env {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// TestDriverDecodesRenderedConfig: every golden jobspec parses as Nomad
// parses it and its task config decodes with the driver's schema into what
// the spec says (the env map included, which the driver declares as
// list(map(string))).
func TestDriverDecodesRenderedConfig(t *testing.T) {
	for _, p := range examples(t) {
		t.Run(filepath.Base(p), func(t *testing.T) {
			tr, diags := spec.ParseFile(p, spec.Options{})
			if diags.HasErrors() {
				t.Fatal(spec.Format(diags, nil))
			}
			golden := goldenPath(p)
			src, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			job := parseJob(t, golden, src)
			if *job.ID != tr.Name || *job.Type != "batch" || len(job.TaskGroups) != 1 {
				t.Fatalf("job %s type %s groups %d", *job.ID, *job.Type, len(job.TaskGroups))
			}
			if job.Meta[contract.MetaKind] != contract.KindTrain {
				t.Errorf("meta %v lacks gpujob = train", job.Meta)
			}
			for k, v := range tr.Meta {
				if job.Meta[k] != v {
					t.Errorf("meta[%s] = %q, want %q", k, job.Meta[k], v)
				}
			}
			if !reflect.DeepEqual(job.Datacenters, tr.Datacenters) {
				t.Errorf("datacenters %v, want %v", job.Datacenters, tr.Datacenters)
			}
			g := job.TaskGroups[0]
			if *g.Count != tr.Workers {
				t.Errorf("count %d, want %d", *g.Count, tr.Workers)
			}
			if *g.RestartPolicy.Attempts != 0 || *g.RestartPolicy.Mode != "fail" {
				t.Errorf("restart %+v", g.RestartPolicy)
			}
			if *g.ReschedulePolicy.Attempts != 0 || *g.ReschedulePolicy.Unlimited {
				t.Errorf("reschedule %+v", g.ReschedulePolicy)
			}
			if len(g.Networks) != 1 || len(g.Networks[0].DynamicPorts) != 1 || g.Networks[0].DynamicPorts[0].Label != render.Port {
				t.Errorf("networks %+v", g.Networks)
			}
			if job.Meta[contract.MetaTask] != render.Task {
				t.Errorf("meta %s = %q, want %q", contract.MetaTask, job.Meta[contract.MetaTask], render.Task)
			}
			// task is the member task (its resources, GPUs and artifacts);
			// gpujob the one the gpujob driver runs: the same task on the
			// host, the sidecar of an image job.
			task, gpujob := findTask(g, render.Task), findTask(g, render.Task)
			wantTasks := 1
			if tr.Image != "" {
				wantTasks = 2
				gpujob = findTask(g, render.Sidecar)
				checkSidecar(t, gpujob)
				checkContainer(t, tr, task)
				if run, ok := job.Meta[contract.MetaRun]; !ok || run != "" {
					t.Errorf("meta %s = %q (set: %v), want it empty for gpujob submit to set", contract.MetaRun, run, ok)
				}
			} else {
				if task.Driver != render.Driver {
					t.Errorf("driver %s", task.Driver)
				}
				if _, ok := job.Meta[contract.MetaRun]; ok {
					t.Errorf("a host job has meta %s", contract.MetaRun)
				}
			}
			if len(g.Tasks) != wantTasks {
				t.Fatalf("%d tasks, want %d", len(g.Tasks), wantTasks)
			}
			if task.KillTimeout == nil || *task.KillTimeout != render.KillTimeout {
				t.Errorf("kill_timeout %v, want %s: room for the ranks' grace and leaving Consul", task.KillTimeout, render.KillTimeout)
			}
			tc := taskConfig(t, gpujob)
			if tc.Command != tr.Command || !reflect.DeepEqual(tc.Args, tr.Args) || tc.Workdir != tr.Workdir || tc.MaxRestarts != tr.MaxFailures {
				t.Errorf("config %+v", tc)
			}
			if tr.Image != "" && (tc.ContainerTask != render.Task || tc.CheckpointRoot != contract.DefaultCheckpointRoot || tc.NProcPerNode != max(tr.GPUsPerWorker, 1)) {
				t.Errorf("sidecar config: container_task %q, checkpoint_root %q, nproc_per_node %d", tc.ContainerTask, tc.CheckpointRoot, tc.NProcPerNode)
			}
			if tr.Image == "" && (tc.ContainerTask != "" || tc.CheckpointRoot != "" || tc.NProcPerNode != 0) {
				t.Errorf("host config: container_task %q, checkpoint_root %q, nproc_per_node %d", tc.ContainerTask, tc.CheckpointRoot, tc.NProcPerNode)
			}
			env := envOf(tc)
			for k, v := range tr.Env {
				if env[k] != v {
					t.Errorf("env[%s] = %q, want %q", k, env[k], v)
				}
			}
			if tr.CheckpointEvery > 0 && env[spec.EnvCheckpointEvery] == "" {
				t.Errorf("env lacks %s: %v", spec.EnvCheckpointEvery, env)
			}
			if tc.Rendezvous == nil || tc.Rendezvous.Port != render.Port || tc.Rendezvous.NNodes == "" || tc.Rendezvous.JoinTimeout == "" {
				t.Errorf("rendezvous %+v", tc.Rendezvous)
			}
			if len(task.Artifacts) != len(tr.Artifacts) {
				t.Errorf("%d artifacts, want %d", len(task.Artifacts), len(tr.Artifacts))
			}
			r := task.Resources
			// On the host /dev/shm is charged to the task; in a container
			// it is docker's shm_size.
			wantMemory := tr.Resources.MemoryMiB + tr.Resources.ShmMiB
			if tr.Image != "" {
				wantMemory = tr.Resources.MemoryMiB
			}
			if *r.CPU != tr.Resources.CPU || *r.MemoryMB != wantMemory {
				t.Errorf("resources cpu %d memory %d", *r.CPU, *r.MemoryMB)
			}
			if tr.GPUsPerWorker == 0 {
				if len(r.Devices) != 0 {
					t.Errorf("a CPU job asks for devices %+v", r.Devices)
				}
			} else if len(r.Devices) != 1 || r.Devices[0].Name != "nvidia/gpu" || int(*r.Devices[0].Count) != tr.GPUsPerWorker {
				t.Errorf("devices %+v", r.Devices)
			}
			if tr.GPU != nil {
				want := 0
				if tr.GPU.Model != "" {
					want++
				}
				if tr.GPU.MinMemoryMiB > 0 {
					want++
				}
				cs := r.Devices[0].Constraints
				if len(cs) != want {
					t.Fatalf("constraints %+v", cs)
				}
				for _, c := range cs {
					switch c.LTarget {
					case "${device.model}":
						if c.RTarget != tr.GPU.Model || c.Operand != "=" {
							t.Errorf("model constraint %+v", c)
						}
					case "${device.attr.memory}":
						if c.RTarget != render.Memory(tr.GPU.MinMemoryMiB) || c.Operand != ">=" {
							t.Errorf("memory constraint %+v", c)
						}
					default:
						t.Errorf("constraint %+v", c)
					}
				}
			}
		})
	}
}

// TestEquivalentToHandWritten: the example spec renders to what
// jobspecs/bert-finetune.nomad.hcl (written by hand) asks for — same group,
// policies, port, resources, device and driver config. The rendered job adds
// only gpujob's meta and GPUJOB_CHECKPOINT_EVERY=20 (the workload's default).
func TestEquivalentToHandWritten(t *testing.T) {
	const handPath = "../../jobspecs/bert-finetune.nomad.hcl"
	handSrc, err := os.ReadFile(handPath)
	if err != nil {
		t.Fatal(err)
	}
	hand := parseJob(t, handPath, handSrc)
	rendered := parseJob(t, "bert-finetune.nomad.hcl", renderFile(t, examplesDir+"/bert-finetune.hcl"))

	if *hand.ID != *rendered.ID || *hand.Type != *rendered.Type || !reflect.DeepEqual(hand.Datacenters, rendered.Datacenters) {
		t.Errorf("job: hand %s %s %v, rendered %s %s %v", *hand.ID, *hand.Type, hand.Datacenters, *rendered.ID, *rendered.Type, rendered.Datacenters)
	}
	hg, rg := hand.TaskGroups[0], rendered.TaskGroups[0]
	for _, c := range []struct {
		what       string
		hand, rend any
	}{
		{"group name", *hg.Name, *rg.Name},
		{"count", *hg.Count, *rg.Count},
		{"networks", hg.Networks, rg.Networks},
		{"restart", hg.RestartPolicy, rg.RestartPolicy},
		{"reschedule", hg.ReschedulePolicy, rg.ReschedulePolicy},
		{"task name", hg.Tasks[0].Name, rg.Tasks[0].Name},
		{"driver", hg.Tasks[0].Driver, rg.Tasks[0].Driver},
		{"resources", hg.Tasks[0].Resources, rg.Tasks[0].Resources},
		{"artifacts", hg.Tasks[0].Artifacts, rg.Tasks[0].Artifacts},
	} {
		if !reflect.DeepEqual(c.hand, c.rend) {
			h, _ := json.Marshal(c.hand)
			r, _ := json.Marshal(c.rend)
			t.Errorf("%s:\nhand-written %s\nrendered     %s", c.what, h, r)
		}
	}
	htc, rtc := taskConfig(t, hg.Tasks[0]), taskConfig(t, rg.Tasks[0])
	renv := envOf(rtc)
	if renv[spec.EnvCheckpointEvery] != "20" {
		t.Errorf("rendered env %v: want %s=20", renv, spec.EnvCheckpointEvery)
	}
	delete(renv, spec.EnvCheckpointEvery)
	if !reflect.DeepEqual(envOf(htc), renv) {
		t.Errorf("env: hand-written %v, rendered %v", envOf(htc), renv)
	}
	htc.Env, rtc.Env = nil, nil
	if !reflect.DeepEqual(htc, rtc) {
		t.Errorf("driver config: hand-written %+v %+v, rendered %+v %+v", htc, *htc.Rendezvous, rtc, *rtc.Rendezvous)
	}
}
