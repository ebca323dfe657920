// Package render turns a training spec into the Nomad jobspec (HCL2) that
// runs it with the gpujob task driver. It writes with hclwrite, never
// string templates, and its output is deterministic: the same spec gives
// the same bytes.
package render

import (
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/hashicorp/hcl/v2/hclwrite"
	"github.com/zclconf/go-cty/cty"

	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/internal/containermember"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/ctyval"
	"github.com/gpujob/gpujob/internal/queue/queuefile"
	"github.com/gpujob/gpujob/internal/safename"
)

// Names shared with the rest of the CLI.
const (
	// Driver is the task driver's name (PluginInfo.Name).
	Driver = "gpujob"
	// KillTimeout is the training tasks' kill_timeout when the spec sets
	// no checkpoint_grace: Nomad clients' default max_kill_timeout, so
	// no client shortens it.
	KillTimeout = spec.DefaultCheckpointGrace
	// Group and Task name the one group and the member task of every
	// rendered job: the task whose allocations' states, events and logs
	// are the member's.
	Group = "train"
	Task  = "train"
	// Port is the label of the group's rendezvous port (MASTER_PORT).
	Port = "rdzv"
	// Device is the device every GPU job asks for.
	Device = contract.GPUDevice

	// Sidecar is an image job's second task: a prestart sidecar on the
	// gpujob driver that prepares the container member (its spec, the
	// static supervisor, the checkpoint directory) and relays its events.
	// The member task Task runs on DockerDriver.
	Sidecar      = "gpujob"
	DockerDriver = "docker"
)

const header = "# Rendered by `gpujob render` from a train spec: edit the spec, not this file.\n"

// Options are the settings of a render that do not come from the spec.
type Options struct {
	// CheckpointRoot is the gpujob driver's checkpoint_root on the clients
	// (an absolute path; empty: contract.DefaultCheckpointRoot). An image job mounts
	// its checkpoint directory from under it into the container, at the
	// same path, and its sidecar names it, so that a client whose driver
	// keeps checkpoints elsewhere refuses the job instead of training
	// without them. Host jobs do not use it.
	CheckpointRoot string
	// Sweep and Trial, both set, make the job a sweep's trial: its gpujob
	// task forwards rank 0's metric lines to the sweep's records in Consul
	// and obeys the sweep controller's stop request.
	Sweep, Trial string
}

// Jobspec renders the Nomad jobspec for t with the default Options.
func Jobspec(t *spec.Train) ([]byte, error) { return Options{}.Jobspec(t) }

// Jobspec renders the Nomad jobspec for t.
func (o Options) Jobspec(t *spec.Train) ([]byte, error) {
	if t == nil {
		return nil, fmt.Errorf("render: no spec")
	}
	if t.Name == "" || t.Command == "" || t.Workers < 1 || t.GPUsPerWorker < 0 {
		return nil, fmt.Errorf("render: spec %q is incomplete (name, command, workers >= 1 and gpus_per_worker >= 0 are required)", t.Name)
	}
	// spec refuses such names with their position; a Train built in code
	// gets the same rule here.
	if err := safename.Validate(t.Name); err != nil {
		return nil, fmt.Errorf("render: job name %q %v: it must be %s", t.Name, err, safename.Allowed)
	}
	root, err := CheckpointRoot(o.CheckpointRoot)
	if err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	if t.ImagePull != nil && t.Image == "" {
		return nil, fmt.Errorf("render: spec %q has image_pull but no image", t.Name)
	}
	kill := t.CheckpointGrace
	if kill == 0 {
		kill = KillTimeout
	}
	if kill < time.Second || kill > spec.MaxCheckpointGrace {
		return nil, fmt.Errorf("render: spec %q: checkpoint_grace %s is not between 1s and %s", t.Name, kill, spec.MaxCheckpointGrace)
	}
	f := hclwrite.NewEmptyFile()
	body := f.Body()
	body.AppendUnstructuredTokens(hclwrite.Tokens{{Type: hclsyntax.TokenComment, Bytes: []byte(header)}})
	body.AppendNewline()

	job := body.AppendNewBlock("job", []string{t.Name}).Body()
	job.SetAttributeValue("type", cty.StringVal("batch"))
	job.SetAttributeValue("datacenters", ctyval.Strings(t.Datacenters))
	if t.Namespace != "" {
		job.SetAttributeValue("namespace", cty.StringVal(t.Namespace))
	}
	if t.NodePool != "" {
		job.SetAttributeValue("node_pool", cty.StringVal(t.NodePool))
	}
	if t.Priority != 0 && t.Priority != spec.DefaultPriority {
		job.SetAttributeValue("priority", cty.NumberIntVal(int64(t.Priority)))
	}
	meta := map[string]string{}
	for k, v := range t.Meta {
		meta[k] = v
	}
	meta[contract.MetaKind] = contract.KindTrain
	meta[contract.MetaWorkers] = strconv.Itoa(t.Workers)
	meta[contract.MetaGPUsPerWorker] = strconv.Itoa(t.GPUsPerWorker)
	meta[contract.MetaTask] = Task
	if t.Queue != "" {
		// spec refuses a bad name with its position; a Train built in
		// code gets the same rule here.
		if err := queuefile.CheckName(t.Queue); err != nil {
			return nil, fmt.Errorf("render: %w", err)
		}
		meta[contract.MetaQueue] = t.Queue
	}
	if t.Image != "" {
		meta[contract.MetaRun] = ""
	}
	if (o.Sweep == "") != (o.Trial == "") {
		return nil, fmt.Errorf("render: a trial needs both its sweep and its trial name (got %q and %q)", o.Sweep, o.Trial)
	}
	if o.Sweep != "" {
		meta[contract.MetaSweep], meta[contract.MetaTrial] = o.Sweep, o.Trial
	}
	job.SetAttributeValue("meta", ctyval.StringMap(meta))
	job.AppendNewline()

	group := job.AppendNewBlock("group", []string{Group}).Body()
	group.SetAttributeValue("count", cty.NumberIntVal(int64(t.Workers)))
	group.AppendNewline()
	// MASTER_PORT: rank 0's allocated port; every member offers its own.
	group.AppendNewBlock("network", nil).Body().AppendNewBlock("port", []string{Port})
	group.AppendNewline()
	// The driver restarts the whole group (max_restarts); Nomad restarting
	// one member alone would only make it rejoin.
	restart := group.AppendNewBlock("restart", nil).Body()
	restart.SetAttributeValue("attempts", cty.Zero)
	restart.SetAttributeValue("mode", cty.StringVal("fail"))
	group.AppendNewline()
	reschedule := group.AppendNewBlock("reschedule", nil).Body()
	reschedule.SetAttributeValue("attempts", cty.Zero)
	reschedule.SetAttributeValue("unlimited", cty.False)
	group.AppendNewline()

	if t.Image == "" {
		task := newTask(group, Task, Driver, kill)
		gpujobConfig(task, t, 0, "", "", 0, o)
		artifacts(task, t)
		memberResources(task, t)
		return f.Bytes(), nil
	}

	// A container member: the sidecar carries the host member's config
	// and prepares the container; the docker task runs the supervisor.
	sidecar := newTask(group, Sidecar, Driver, kill)
	lc := sidecar.AppendNewBlock("lifecycle", nil).Body()
	lc.SetAttributeValue("hook", cty.StringVal("prestart"))
	lc.SetAttributeValue("sidecar", cty.True)
	sidecar.AppendNewline()
	// It holds no GPUs to count: the ranks per member are explicit.
	gpujobConfig(sidecar, t, max(t.GPUsPerWorker, 1), Task, root, kill, o)
	sidecar.AppendNewline()
	res := sidecar.AppendNewBlock("resources", nil).Body()
	res.SetAttributeValue("cpu", cty.NumberIntVal(spec.SidecarCPU))
	res.SetAttributeValue("memory", cty.NumberIntVal(spec.SidecarMemoryMiB))
	group.AppendNewline()

	task := newTask(group, Task, DockerDriver, kill)
	// Root in the container, whatever USER the image names: the supervisor
	// reads its root-only spec (the Consul token) and starts the ranks as
	// the driver's default_user, as on the host.
	task.SetAttributeValue("user", cty.StringVal("0"))
	task.AppendNewline()
	dockerConfig(task, t, root)
	artifacts(task, t)
	memberResources(task, t)
	return f.Bytes(), nil
}

// CheckpointRoot checks a checkpoint root for Options and returns it
// cleaned, or contract.DefaultCheckpointRoot for "".
func CheckpointRoot(root string) (string, error) {
	if root == "" {
		return contract.DefaultCheckpointRoot, nil
	}
	switch {
	case !path.IsAbs(root):
		return "", fmt.Errorf("checkpoint root %q must be an absolute path (the gpujob driver's checkpoint_root on the clients)", root)
	case !utf8.ValidString(root) || strings.IndexFunc(root, unicode.IsControl) >= 0 ||
		strings.Contains(root, "${") || strings.Contains(root, "%{"):
		// Nomad would interpolate a template sequence in a mount path.
		return "", fmt.Errorf("checkpoint root %q may not hold control characters, invalid UTF-8, \"${\" or \"%%{\"", root)
	}
	return path.Clean(root), nil
}

// ContainerPidsLimit is a container member's docker pids_limit.
const ContainerPidsLimit = 4096

// newTask appends task "name" on driver with kill_timeout kill (the
// spec's checkpoint_grace).
func newTask(group *hclwrite.Body, name, driver string, kill time.Duration) *hclwrite.Body {
	task := group.AppendNewBlock("task", []string{name}).Body()
	task.SetAttributeValue("driver", cty.StringVal(driver))
	// Nomad's default 5s is too short for a stop's cleanup: the supervisor
	// gives most of kill_timeout to the ranks (to save a checkpoint on
	// SIGTERM: a preemption's grace) and the rest to leaving the
	// rendezvous in Consul.
	task.SetAttributeValue("kill_timeout", cty.StringVal(Duration(kill)))
	task.AppendNewline()
	return task
}

// gpujobConfig writes the gpujob driver's config. A sidecar's (container
// set) also names its docker task, the checkpoint root its mounts were
// rendered for, the docker task's kill_timeout kill, and nproc ranks per
// member.
func gpujobConfig(task *hclwrite.Body, t *spec.Train, nproc int, container, root string, kill time.Duration, o Options) {
	config := task.AppendNewBlock("config", nil).Body()
	config.SetAttributeValue("command", cty.StringVal(t.Command))
	if len(t.Args) > 0 {
		config.SetAttributeValue("args", ctyval.Strings(t.Args))
	}
	if nproc > 0 {
		config.SetAttributeValue("nproc_per_node", cty.NumberIntVal(int64(nproc)))
	}
	if t.Workdir != "" {
		config.SetAttributeValue("workdir", cty.StringVal(t.Workdir))
	}
	if len(t.Preload) > 0 {
		config.SetAttributeValue("preload", ctyval.Strings(t.Preload))
	}
	config.SetAttributeValue("max_restarts", cty.NumberIntVal(int64(t.MaxFailures)))
	env := map[string]string{}
	for k, v := range t.Env {
		env[k] = v
	}
	if t.CheckpointEvery > 0 {
		env[spec.EnvCheckpointEvery] = strconv.Itoa(t.CheckpointEvery)
	}
	if len(env) > 0 {
		config.SetAttributeValue("env", ctyval.StringMap(env))
	}
	if container != "" {
		config.SetAttributeValue("container_task", cty.StringVal(container))
		config.SetAttributeValue("checkpoint_root", cty.StringVal(root))
	}
	if o.Sweep != "" {
		config.SetAttributeValue("sweep", cty.StringVal(o.Sweep))
		config.SetAttributeValue("trial", cty.StringVal(o.Trial))
	}
	if container != "" {
		// The supervisor in the container plans a stop by it: docker
		// stops that member, and the gpujob driver never hears of it.
		// A line of its own, so the attributes above keep their layout.
		config.AppendNewline()
		config.SetAttributeValue("container_kill_timeout", cty.StringVal(Duration(kill)))
	}
	config.AppendNewline()
	rdzv := config.AppendNewBlock("rendezvous", nil).Body()
	rdzv.SetAttributeValue("nnodes", cty.StringVal(strconv.Itoa(t.Workers)))
	rdzv.SetAttributeValue("port", cty.StringVal(Port))
	timeout := t.RendezvousTimeout
	if timeout <= 0 {
		timeout = spec.DefaultRendezvousTimeout
	}
	rdzv.SetAttributeValue("join_timeout", cty.StringVal(Duration(timeout)))
}

// dockerConfig writes the docker driver's config of a container member:
// the image runs the static supervisor the sidecar put in the run
// directory, on the host network (the rendezvous port is the node's), with
// the checkpoint directory at the path the supervisor and the ranks know.
func dockerConfig(task *hclwrite.Body, t *spec.Train, root string) {
	config := task.AppendNewBlock("config", nil).Body()
	config.SetAttributeValue("image", cty.StringVal(t.Image))
	// The entrypoint, not command: Nomad's docker driver passes command
	// and args to the image's own ENTRYPOINT when it has one, which would
	// run before the supervisor (as root, beside the spec) or not run it.
	config.SetAttributeValue("entrypoint", ctyval.Strings([]string{containermember.SupervisorPath(), containermember.SpecPath()}))
	config.SetAttributeValue("network_mode", cty.StringVal("host"))
	// An init as PID 1 forwards the stop signal to the supervisor and
	// reaps what the ranks leave.
	config.SetAttributeValue("init", cty.True)
	// The host members' cap (the gpujob driver's pids_limit default): a
	// fork bomb in the container exhausts its own allowance, not the
	// machine's PIDs.
	config.SetAttributeValue("pids_limit", cty.NumberIntVal(ContainerPidsLimit))
	if p := t.ImagePull; p != nil {
		if p.Force {
			config.SetAttributeValue("force_pull", cty.True)
		}
		if p.Timeout > 0 {
			config.SetAttributeValue("image_pull_timeout", cty.StringVal(Duration(p.Timeout)))
		}
	}
	if t.Resources.ShmMiB > 0 {
		// Bytes; the container's /dev/shm instead of extra task memory.
		config.SetAttributeValue("shm_size", cty.NumberIntVal(int64(t.Resources.ShmMiB)<<20))
	}
	if p := t.ImagePull; p != nil && p.Auth != nil && *p.Auth != (spec.RegistryAuth{}) {
		config.AppendNewline()
		auth := config.AppendNewBlock("auth", nil).Body()
		for _, a := range []struct{ name, value string }{
			{"username", p.Auth.Username}, {"password", p.Auth.Password}, {"server_address", p.Auth.ServerAddress},
		} {
			if a.value != "" {
				auth.SetAttributeValue(a.name, cty.StringVal(a.value))
			}
		}
	}

	// The run directory: the supervisor and its spec, read-only.
	config.AppendNewline()
	run := config.AppendNewBlock("mount", nil).Body()
	run.SetAttributeValue("type", cty.StringVal("bind"))
	run.SetAttributeRaw("source", quoted(literal(containermember.RunRoot+"/"), interp("NOMAD_ALLOC_ID")))
	run.SetAttributeValue("target", cty.StringVal(containermember.MountPoint))
	run.SetAttributeValue("readonly", cty.True)

	// The run's checkpoint directory, which the sidecar creates as the
	// driver does for a host member: <root>/<namespace>/<job>[/<run>],
	// with each name in its safe encoding (internal/safename). Both are
	// the ones the job runs under, as the driver sees them: NOMAD_NAMESPACE
	// or `nomad job run -namespace` choose the namespace over the spec's,
	// and a rendered file may be run under another job ID. A namespace
	// name is always its own encoding, and so is every job ID gpujob
	// renders.
	config.AppendNewline()
	ckpt := quoted(literal(root+"/"), interp("NOMAD_NAMESPACE"), literal("/"), interp("NOMAD_JOB_ID"), literal("/"), interp("NOMAD_META_"+contract.MetaRun))
	mnt := config.AppendNewBlock("mount", nil).Body()
	mnt.SetAttributeValue("type", cty.StringVal("bind"))
	mnt.SetAttributeRaw("source", ckpt)
	mnt.SetAttributeRaw("target", ckpt)
	mnt.SetAttributeValue("readonly", cty.False)
}

// artifacts writes the spec's artifact blocks (into the member task's
// local/ directory).
func artifacts(task *hclwrite.Body, t *spec.Train) {
	for _, a := range t.Artifacts {
		task.AppendNewline()
		art := task.AppendNewBlock("artifact", nil).Body()
		art.SetAttributeValue("source", cty.StringVal(a.Source))
		if a.Destination != "" {
			art.SetAttributeValue("destination", cty.StringVal(a.Destination))
		}
		if len(a.Options) > 0 {
			// Nomad reads artifact options as a block only.
			opts := art.AppendNewBlock("options", nil).Body()
			for _, k := range sortedKeys(a.Options) {
				opts.SetAttributeValue(k, cty.StringVal(a.Options[k]))
			}
		}
	}
}

// memberResources writes the member task's resources: the spec's cpu and
// memory (with shm on the host, whose /dev/shm pages are charged to the
// task) and the GPUs with their constraints.
func memberResources(task *hclwrite.Body, t *spec.Train) {
	resources(task, t.Resources.CPU, t.MemberMemoryMiB(), t.GPUsPerWorker, t.GPU)
}

// resources writes a task's resources block: cpu, memory and gpus GPUs
// under the gpu block's constraints (nil: none).
func resources(task *hclwrite.Body, cpu, memoryMiB, gpus int, gpu *spec.GPU) {
	task.AppendNewline()
	res := task.AppendNewBlock("resources", nil).Body()
	res.SetAttributeValue("cpu", cty.NumberIntVal(int64(cpu)))
	res.SetAttributeValue("memory", cty.NumberIntVal(int64(memoryMiB)))
	if gpus == 0 {
		return
	}
	res.AppendNewline()
	dev := res.AppendNewBlock("device", []string{Device}).Body()
	dev.SetAttributeValue("count", cty.NumberIntVal(int64(gpus)))
	if gpu != nil && gpu.Model != "" {
		dev.AppendNewline()
		c := dev.AppendNewBlock("constraint", nil).Body()
		c.SetAttributeRaw("attribute", interpolation("device", "model"))
		c.SetAttributeValue("value", cty.StringVal(gpu.Model))
	}
	if gpu != nil && gpu.MinMemoryMiB > 0 {
		dev.AppendNewline()
		c := dev.AppendNewBlock("constraint", nil).Body()
		c.SetAttributeRaw("attribute", interpolation("device", "attr", "memory"))
		c.SetAttributeValue("operator", cty.StringVal(">="))
		c.SetAttributeValue("value", cty.StringVal(Memory(gpu.MinMemoryMiB)))
	}
}

// interpolation is the tokens of "${a.b.c}": a Nomad runtime attribute
// (the jobspec parser leaves ${device.*}, ${attr.*}, … to the scheduler).
func interpolation(parts ...string) hclwrite.Tokens { return quoted(interp(parts...)) }

// quoted is a quoted string of pieces: literal text and interpolations.
func quoted(pieces ...hclwrite.Tokens) hclwrite.Tokens {
	toks := hclwrite.Tokens{{Type: hclsyntax.TokenOQuote, Bytes: []byte(`"`)}}
	for _, p := range pieces {
		toks = append(toks, p...)
	}
	return append(toks, &hclwrite.Token{Type: hclsyntax.TokenCQuote, Bytes: []byte(`"`)})
}

// literal is s inside a quoted string, escaped ("$${" for "${").
func literal(s string) hclwrite.Tokens {
	toks := hclwrite.TokensForValue(cty.StringVal(s))
	return toks[1 : len(toks)-1] // without the quotes
}

// interp is "${a.b.c}" inside a quoted string: left to Nomad, which
// interpolates runtime variables and attributes.
func interp(parts ...string) hclwrite.Tokens {
	toks := hclwrite.Tokens{{Type: hclsyntax.TokenTemplateInterp, Bytes: []byte(`${`)}}
	for i, p := range parts {
		if i > 0 {
			toks = append(toks, &hclwrite.Token{Type: hclsyntax.TokenDot, Bytes: []byte(".")})
		}
		toks = append(toks, &hclwrite.Token{Type: hclsyntax.TokenIdent, Bytes: []byte(p)})
	}
	return append(toks, &hclwrite.Token{Type: hclsyntax.TokenTemplateSeqEnd, Bytes: []byte("}")})
}

// Duration writes d the short way: "5m", "1h30m", "90s" → "1m30s".
func Duration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// Memory writes a MiB count with Nomad's units: "16 GiB" when whole, else
// "1536 MiB".
func Memory(mib int) string {
	if mib%1024 == 0 {
		return fmt.Sprintf("%d GiB", mib/1024)
	}
	return fmt.Sprintf("%d MiB", mib)
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
