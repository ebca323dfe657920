package driver

import (
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/nomad/client/allocdir"
	"github.com/hashicorp/nomad/plugins/drivers"

	"github.com/gpujob/gpujob/driver/supervisor"
	"github.com/gpujob/gpujob/internal/safename"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

// Defaults for the task's rendezvous block.
const (
	defaultJoinTimeout = 5 * time.Minute
	defaultLastCall    = 5 * time.Second
	defaultStopGrace   = 3 * time.Second
)

// buildSpec turns Nomad's task config and ours into the supervisor's spec.
// It is pure apart from reading CONSUL_HTTP_* when the plugin config leaves
// them out, so every rule here is unit-tested.
func buildSpec(cfg *drivers.TaskConfig, tc *TaskConfig, pc *Config, getenv func(string) string) (*supervisor.Spec, error) {
	if tc.Command == "" {
		return nil, fmt.Errorf("command: must not be empty")
	}
	if tc.ContainerKillTimeout != "" && tc.ContainerTask == "" {
		return nil, fmt.Errorf("container_kill_timeout: only a container member's sidecar (with container_task) takes it; " +
			"a host member's supervisor learns its task's kill_timeout from the stop itself")
	}
	if tc.Service {
		if err := checkService(tc); err != nil {
			return nil, err
		}
	}
	rdv := tc.Rendezvous
	if rdv == nil {
		rdv = &RendezvousConfig{}
	}
	min, max, err := parseNNodes(rdv.NNodes)
	if err != nil {
		return nil, err
	}
	join, err := duration("rendezvous.join_timeout", rdv.JoinTimeout, defaultJoinTimeout)
	if err != nil {
		return nil, err
	}
	lastCall, err := duration("rendezvous.last_call", rdv.LastCall, defaultLastCall)
	if err != nil {
		return nil, err
	}
	if tc.Workdir != "" && !filepath.IsAbs(tc.Workdir) {
		return nil, fmt.Errorf("workdir: %q must be an absolute path on the client", tc.Workdir)
	}
	if tc.MaxRestarts < 0 {
		return nil, fmt.Errorf("max_restarts: must be 0 or more, got %d", tc.MaxRestarts)
	}
	nproc := tc.NProcPerNode
	if nproc < 0 {
		return nil, fmt.Errorf("nproc_per_node: must be 1 or more, got %d", nproc)
	}
	if nproc == 0 {
		nproc = gpuCount(cfg)
		if tc.Service {
			// A replica is one server process with all the task's GPUs.
			nproc = 1
		}
	}
	logPrefix := nproc > 1
	if tc.LogPrefix != nil {
		logPrefix = *tc.LogPrefix
	}
	addr, err := memberAddr(cfg, rdv.Port, max)
	if err != nil {
		return nil, err
	}

	// Nomad lets a hand-written job ID be almost anything ("../../x",
	// "a/b", tabs): every name is encoded into one safe segment before it
	// reaches a path or a Consul key. Ordinary names are their own
	// encoding, so the layout <root>/<ns>/<job>[/<run>] is unchanged.
	ns := safename.Encode(firstOf(cfg.Namespace, "default"))
	job := safename.Encode(firstOf(cfg.JobID, cfg.JobName))
	group := safename.Encode(cfg.TaskGroupName)
	// Members are named like allocations, "<job>.<group>[<index>]", from
	// the same encoded parts: the rendezvous orders ranks by name and
	// refuses tabs and newlines in it, and every member must compute
	// the same names for itself and for the expected ones.
	allocName := cfg.Env["NOMAD_ALLOC_NAME"]
	if index, ok := cfg.Env["NOMAD_ALLOC_INDEX"]; ok || allocName == "" {
		allocName = memberName(job, group, index)
	}
	expected := make([]string, max)
	for i := range expected {
		expected[i] = memberName(job, group, strconv.Itoa(i))
	}
	// Nomad builds the task directory as <alloc dir>/<task name> and
	// refuses only slashes and NULs in a task name: ".", ".." or "alloc"
	// (the shared directory every task and the alloc fs API can read)
	// would make the task's directory, which the driver secures for the
	// ranks' user (taskdirs.go), the allocation's or its parent.
	if t := cfg.Name; t == "" || t == "." || t == ".." || t == allocdir.SharedAllocName || strings.ContainsAny(t, `/\`) {
		return nil, fmt.Errorf("task name %q: the gpujob driver needs a task directory of its own under the allocation directory (a name other than \".\", \"..\" or %q, without slashes)", t, allocdir.SharedAllocName)
	}

	// Each `gpujob submit` is a fresh run with a fresh restart budget; the
	// members of one submission (replacements too) share its run.
	// A job without the meta (written by hand) is one run for its whole
	// life, with no group of earlier submissions to clear.
	runID, runGroup := ns+"/"+job, ""
	submission := cfg.Env["NOMAD_META_gpujob_run"]
	if validRunName(submission) {
		runID, runGroup = runID+"/"+submission, runID
	} else {
		submission = ""
	}
	ckpt, err := checkpointDir(pc.CheckpointRoot, ns, job, submission)
	if err != nil {
		return nil, err
	}

	consul, err := consulSpec(pc, getenv)
	if err != nil {
		return nil, err
	}
	maxRestarts := tc.MaxRestarts
	if tc.Service {
		// A replica needs no Consul of the driver's (Nomad registers and
		// checks it), so its supervisor gets no address and no token; and
		// it restarts through Nomad's restart policy, so that Consul and
		// the gateway see it go and come back.
		consul, maxRestarts = supervisor.ConsulSpec{}, 0
	}
	report, err := reportSpec(cfg, tc, pc)
	if err != nil {
		return nil, err
	}

	s := &supervisor.Spec{
		Command:       tc.Command,
		Args:          tc.Args,
		Env:           tc.envMap(),
		Workdir:       tc.Workdir,
		NProcPerNode:  nproc,
		LogPrefix:     logPrefix,
		Preload:       tc.Preload,
		RunID:         runID,
		RunGroup:      runGroup,
		RoleName:      "default",
		Self:          supervisor.Member{ID: cfg.AllocID, Name: allocName, Addr: addr},
		Expected:      expected,
		Min:           min,
		Max:           max,
		JoinTimeout:   supervisor.Duration(join),
		LastCall:      supervisor.Duration(lastCall),
		MaxRestarts:   maxRestarts,
		CheckpointDir: ckpt,
		StopGrace:     supervisor.Duration(defaultStopGrace),
		Consul:        consul,
		Report:        report,
		Solo:          tc.Service,
	}
	return s, s.Validate()
}

// checkService refuses what a service replica cannot have: it joins no
// group, so a rendezvous block, a sweep trial or several processes would be
// silently meaningless.
func checkService(tc *TaskConfig) error {
	switch {
	case tc.Rendezvous != nil:
		return fmt.Errorf("service: a service replica joins no rendezvous; remove the rendezvous block")
	case tc.Sweep != "" || tc.Trial != "":
		return fmt.Errorf("service: a service replica cannot be a sweep's trial; remove sweep and trial")
	case tc.NProcPerNode > 1:
		return fmt.Errorf("service: a service replica runs one process (nproc_per_node = %d); run more replicas instead", tc.NProcPerNode)
	case tc.ContainerTask != "":
		return fmt.Errorf("service: container service replicas are not supported yet; remove container_task")
	}
	return nil
}

// reportSpec is a sweep trial's records, nil for a task that is no trial.
// The namespace is the job's, as Nomad gives it to the driver, never a
// name from the task config: a job can only report into, and be stopped
// from, its own namespace's sweeps, which is what an operator's Consul
// ACLs and the sweep controller's token assume.
func reportSpec(cfg *drivers.TaskConfig, tc *TaskConfig, pc *Config) (*supervisor.ReportSpec, error) {
	if tc.Sweep == "" && tc.Trial == "" {
		return nil, nil
	}
	if tc.Sweep == "" || tc.Trial == "" {
		return nil, fmt.Errorf("sweep and trial: a sweep's trial names both (got sweep %q, trial %q)", tc.Sweep, tc.Trial)
	}
	prefix := firstOf(pc.SweepKeyPrefix, sweepkv.DefaultPrefix)
	ns := firstOf(cfg.Namespace, "default")
	return &supervisor.ReportSpec{
		MetricsKey: sweepkv.MetricsKey(prefix, ns, tc.Sweep, tc.Trial),
		StopKey:    sweepkv.StopKey(prefix, ns, tc.Sweep, tc.Trial),
	}, nil
}

// gpuCount is how many GPUs the device plugin reserved to the task, from the
// CUDA_VISIBLE_DEVICES it set; 1 without GPUs (a CPU run).
func gpuCount(cfg *drivers.TaskConfig) int {
	v := cfg.DeviceEnv["CUDA_VISIBLE_DEVICES"]
	if v == "" {
		v = cfg.Env["CUDA_VISIBLE_DEVICES"]
	}
	n := 0
	for _, id := range strings.Split(v, ",") {
		if strings.TrimSpace(id) != "" {
			n++
		}
	}
	return max(n, 1)
}

// memberAddr is the host:port this member offers as the master address: the
// port Nomad allocated under the label, on its host IP. A single-node group
// needs no allocated port; it takes a free one on loopback.
func memberAddr(cfg *drivers.TaskConfig, label string, nnodes int) (string, error) {
	if label == "" {
		if nnodes > 1 {
			return "", fmt.Errorf("rendezvous.port: required when nnodes > 1; add network { port \"rdzv\" {} } to the group and port = \"rdzv\"")
		}
		return freeLoopbackAddr()
	}
	if cfg.Resources != nil && cfg.Resources.Ports != nil {
		if p, ok := cfg.Resources.Ports.Get(label); ok {
			host := p.HostIP
			if host == "" {
				host = "127.0.0.1"
			}
			return net.JoinHostPort(host, strconv.Itoa(p.Value)), nil
		}
	}
	return "", fmt.Errorf("rendezvous.port: the group's network block has no port labelled %q", label)
}

func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("finding a free port for a single-node group: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func firstOf(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

// consulSpec is how supervisors reach Consul: the plugin config, else the
// CONSUL_HTTP_* environment of the Nomad client, else the local agent.
func consulSpec(pc *Config, getenv func(string) string) (supervisor.ConsulSpec, error) {
	ttl, err := time.ParseDuration(pc.SessionTTL)
	if err != nil {
		return supervisor.ConsulSpec{}, fmt.Errorf("session_ttl: %w", err)
	}
	cc := pc.Consul
	if cc == nil {
		cc = &ConsulConfig{}
	}
	c := supervisor.ConsulSpec{
		Address:    firstOf(cc.Address, getenv("CONSUL_HTTP_ADDR"), "127.0.0.1:8500"),
		Token:      firstOf(cc.Token, getenv("CONSUL_HTTP_TOKEN")),
		Datacenter: cc.Datacenter,
		CAFile:     firstOf(cc.CAFile, getenv("CONSUL_CACERT")),
		CertFile:   firstOf(cc.CertFile, getenv("CONSUL_CLIENT_CERT")),
		KeyFile:    firstOf(cc.KeyFile, getenv("CONSUL_CLIENT_KEY")),
		KeyPrefix:  pc.KeyPrefix,
		SessionTTL: supervisor.Duration(ttl),
	}
	// CONSUL_HTTP_ADDR may carry a scheme; the client wants it apart.
	if rest, ok := strings.CutPrefix(c.Address, "https://"); ok {
		c.Address, c.Scheme = rest, "https"
	}
	c.Address = strings.TrimPrefix(c.Address, "http://")
	if c.CAFile != "" || c.CertFile != "" || getenv("CONSUL_HTTP_SSL") == "true" {
		c.Scheme = "https"
	}
	return c, nil
}

// memberName is a member's name in the rendezvous, the allocation's name
// with encoded parts: "<job>.<group>[<index>]".
func memberName(job, group, index string) string {
	return fmt.Sprintf("%s.%s[%s]", job, group, index)
}

// checkpointDir is <root>/<namespace>/<job>, the same for every restart of a
// run. `gpujob submit` stamps each submission with the job meta gpujob_run,
// which adds a level, so a resubmitted job starts fresh instead of resuming
// its predecessor's final checkpoint. The parts must be safename segments
// (run may be empty); the result is checked to lie strictly under root all
// the same, so that a bug in composing it fails the task instead of
// letting the supervisor create and chown a directory elsewhere.
func checkpointDir(root string, parts ...string) (string, error) {
	var segs []string
	for _, p := range parts {
		if p != "" {
			segs = append(segs, p)
		}
	}
	dir := filepath.Join(append([]string{root}, segs...)...)
	rel, err := filepath.Rel(filepath.Clean(root), dir)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) || filepath.IsAbs(rel) ||
		strings.Count(rel, string(filepath.Separator)) != len(segs)-1 {
		return "", fmt.Errorf("checkpoint directory %q is not %d level(s) inside checkpoint_root %q; refusing to create it", dir, len(segs), root)
	}
	return dir, nil
}

// validRunName reports whether a gpujob_run value can name a submission.
// `gpujob submit` stamps a Unix time; a value that is not its own safe
// encoding, or that is a name of the rendezvous layout under a run (ctl,
// m, roster: the rendezvous refuses those as a run of a group), is
// ignored, and the job is one run for its whole life as without the meta.
func validRunName(run string) bool {
	return safename.IsPlain(run) && run != "ctl" && run != "m" && run != "roster"
}
