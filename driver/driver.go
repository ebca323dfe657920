// Package driver is the nomad-driver-gpujob task driver. Each task runs a
// supervisor (package supervisor) through Nomad's shared executor; the
// supervisors of a group meet in a Consul rendezvous (package rendezvous),
// agree on ranks, start the training processes together and restart them
// together. The driver itself stays thin, like raw_exec: it prepares the
// supervisor's spec, launches and recovers executors, and turns the
// supervisor's milestones into Nomad task events.
package driver

import (
	"context"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/consul-template/signals"
	hclog "github.com/hashicorp/go-hclog"
	plugin "github.com/hashicorp/go-plugin"
	"github.com/hashicorp/nomad/client/allocdir"
	"github.com/hashicorp/nomad/drivers/shared/eventer"
	"github.com/hashicorp/nomad/drivers/shared/executor"
	"github.com/hashicorp/nomad/plugins/base"
	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/hashicorp/nomad/plugins/shared/hclspec"
	pstructs "github.com/hashicorp/nomad/plugins/shared/structs"

	"github.com/gpujob/gpujob/driver/supervisor"
	"github.com/gpujob/gpujob/internal/containermember"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/taskevent"
)

const (
	// PluginName is what jobs put in `driver = "gpujob"`.
	PluginName = contract.DriverName
	// SuperviseCommand is the argument that makes the plugin binary run as a
	// task's supervisor instead of as the plugin.
	SuperviseCommand = "supervise"

	fingerprintPeriod = 30 * time.Second
)

// PluginVersion is set at build time with -ldflags.
var PluginVersion = "0.1.0"

var capabilities = &drivers.Capabilities{
	SendSignals:       true,
	Exec:              true,
	FSIsolation:       drivers.FSIsolationNone,
	NetIsolationModes: []drivers.NetIsolationMode{drivers.NetIsolationModeHost, drivers.NetIsolationModeGroup},
	MountConfigs:      drivers.MountConfigSupportNone,
}

// Driver implements drivers.DriverPlugin.
type Driver struct {
	eventer *eventer.Eventer
	logger  hclog.Logger
	ctx     context.Context
	cancel  context.CancelFunc
	tasks   *taskStore
	// self is the plugin binary, which the executor runs as the supervisor.
	self string
	// cgroups puts each task in its own cgroup, which the executor kills
	// whole; only root can. Without, the driver kills what the ranks leave.
	cgroups bool
	// runRoot is where container members' run directories go
	// (containermember.RunRoot; tests use their own).
	runRoot string

	mu          sync.Mutex
	config      *Config
	nomadConfig *base.ClientDriverConfig
}

// New returns the driver; self is the path of the binary that serves
// SuperviseCommand (the plugin's own executable).
func New(logger hclog.Logger, self string) *Driver {
	ctx, cancel := context.WithCancel(context.Background())
	logger = logger.Named(PluginName)
	return &Driver{
		eventer: eventer.NewEventer(ctx, logger),
		logger:  logger,
		ctx:     ctx,
		cancel:  cancel,
		tasks:   newTaskStore(),
		self:    self,
		cgroups: runtime.GOOS == "linux" && syscall.Geteuid() == 0,
		runRoot: containermember.RunRoot,
	}
}

func (d *Driver) PluginInfo() (*base.PluginInfoResponse, error) {
	return &base.PluginInfoResponse{
		Type:              base.PluginTypeDriver,
		PluginApiVersions: []string{drivers.ApiVersion010},
		PluginVersion:     PluginVersion,
		Name:              PluginName,
	}, nil
}

func (d *Driver) ConfigSchema() (*hclspec.Spec, error) { return configSpec, nil }

func (d *Driver) SetConfig(c *base.Config) error {
	var cfg Config
	if len(c.PluginConfig) != 0 {
		if err := base.MsgPackDecode(c.PluginConfig, &cfg); err != nil {
			return fmt.Errorf("nomad-driver-gpujob: decoding the plugin config: %w", err)
		}
	}
	if err := cfg.validate(); err != nil {
		return fmt.Errorf("nomad-driver-gpujob: invalid config: %w", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.config = &cfg
	if c.AgentConfig != nil {
		d.nomadConfig = c.AgentConfig.Driver
	}
	return nil
}

func (d *Driver) settings() (*Config, *base.ClientDriverConfig) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.config, d.nomadConfig
}

func (d *Driver) TaskConfigSchema() (*hclspec.Spec, error) { return taskConfigSpec, nil }

func (d *Driver) Capabilities() (*drivers.Capabilities, error) { return capabilities, nil }

func (d *Driver) Fingerprint(ctx context.Context) (<-chan *drivers.Fingerprint, error) {
	ch := make(chan *drivers.Fingerprint)
	go func() {
		defer close(ch)
		t := time.NewTimer(0)
		defer t.Stop()
		var health consulHealth
		for {
			select {
			case <-ctx.Done():
				return
			case <-d.ctx.Done():
				return
			case <-t.C:
			}
			fp, next := d.fingerprint(ctx, &health)
			t.Reset(next)
			select {
			case ch <- fp:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch, nil
}

// fingerprint is healthy when the supervisors will be able to reach Consul:
// a node whose Consul is down must not be given training tasks that would
// only time out in the rendezvous. A Consul that answered before and is down
// for less than consulOutageGrace keeps the driver healthy (see
// consulHealth). It also returns when to fingerprint next.
func (d *Driver) fingerprint(ctx context.Context, health *consulHealth) (*drivers.Fingerprint, time.Duration) {
	cfg, _ := d.settings()
	if cfg == nil {
		return &drivers.Fingerprint{Health: drivers.HealthStateUndetected, HealthDescription: "waiting for the plugin config"}, fingerprintRetryPeriod
	}
	fp := &drivers.Fingerprint{Attributes: map[string]*pstructs.Attribute{
		"driver.gpujob":         pstructs.NewBoolAttribute(true),
		"driver.gpujob.version": pstructs.NewStringAttribute(PluginVersion),
	}}
	// A default_user this node lacks would fail every task without a user:
	// keep them off the node, saying why.
	if isRoot() {
		if _, err := resolveIdentity("", policyFor(cfg, "", 0), user.Lookup); err != nil {
			fp.Health, fp.HealthDescription = drivers.HealthStateUnhealthy, err.Error()
			return fp, fingerprintPeriod
		}
	}
	spec, err := consulSpec(cfg, os.Getenv)
	if err != nil {
		fp.Health, fp.HealthDescription = drivers.HealthStateUnhealthy, err.Error()
		return fp, fingerprintPeriod
	}
	var next time.Duration
	fp.Health, fp.HealthDescription, next = health.observe(time.Now(), supervisor.CheckConsul(ctx, spec))
	return fp, next
}

func (d *Driver) StartTask(cfg *drivers.TaskConfig) (*drivers.TaskHandle, *drivers.DriverNetwork, error) {
	if _, ok := d.tasks.Get(cfg.ID); ok {
		return nil, nil, fmt.Errorf("task %q is already started", cfg.ID)
	}
	pc, nomadConfig := d.settings()
	if pc == nil {
		return nil, nil, fmt.Errorf("nomad-driver-gpujob has no config yet")
	}
	var tc TaskConfig
	if err := cfg.DecodeDriverConfig(&tc); err != nil {
		return nil, nil, fmt.Errorf("decoding the task config: %w", err)
	}
	// Who the ranks run as, decided before anything is created for them.
	runAs, err := resolveIdentity(cfg.User, policyFor(pc, firstOf(cfg.Namespace, "default"), os.Geteuid()), user.Lookup)
	if err != nil {
		return nil, nil, err
	}
	if tc.ContainerTask != "" {
		return d.startContainerMember(cfg, &tc, pc, runAs)
	}
	spec, err := buildSpec(cfg, &tc, pc, os.Getenv)
	if err != nil {
		return nil, nil, fmt.Errorf("gpujob task config: %w", err)
	}
	if err := inlineConsulTLS(&spec.Consul, os.ReadFile); err != nil {
		return nil, nil, fmt.Errorf("nomad-driver-gpujob plugin config: %w", err)
	}
	spec.RunAs = runAs
	visible := reservedGPUs(cfg)
	spec.VisibleDevices = &visible
	var why string
	if spec.GPUIsolation, why = gpuIsolation(cfg, isRoot(), supervisor.DevicesV1Cgroup); spec.GPUIsolation == nil {
		d.logger.Debug("no device cgroup for the task's GPUs", "task", cfg.Name, "alloc_id", cfg.AllocID, "reason", why)
	}
	spec.PidsLimit = pidsLimit(cfg, pc.PidsLimit, isRoot(), supervisor.PidsV1Cgroup)
	spec.TaskEnv = taskEnvList(cfg.Env, agentEnviron(os.Environ()), pc.hostEnv)
	stateDir, err := taskStateDir(d.runRoot, cfg.AllocID, cfg.Name)
	if err != nil {
		return nil, nil, fmt.Errorf("gpujob task config: %w", err)
	}
	placeStateFiles(spec, stateDir)
	if err := makeStateDir(d.runRoot, stateDir); err != nil {
		return nil, nil, fmt.Errorf("preparing the task's state directory: %w", err)
	}
	// Nothing of the task's may outlive a failed start: the state
	// directory holds the Consul token.
	started := false
	defer func() {
		if !started {
			_ = removeStateDir(stateDir)
		}
	}()
	if err := secureTaskDirs(cfg, runAs); err != nil {
		return nil, nil, err
	}
	if err := prepareCheckpointDir(pc.CheckpointRoot, spec.CheckpointDir, runAs); err != nil {
		return nil, nil, err
	}
	// A task restarted in place (nomad alloc restart) keeps its state
	// directory: the last run's stop deadline and rank groups are not this one's.
	for _, stale := range []string{spec.StopDeadlineFile, spec.GroupsFile} {
		if err := os.Remove(stale); err != nil && !os.IsNotExist(err) {
			return nil, nil, fmt.Errorf("clearing %s: %w", stale, err)
		}
	}
	specPath := filepath.Join(stateDir, specFileName)
	if err := supervisor.WriteSpec(specPath, spec); err != nil {
		return nil, nil, err
	}

	logger := d.logger.With("task", cfg.Name, "alloc_id", cfg.AllocID)
	exec, pluginClient, err := executor.CreateExecutor(logger, nomadConfig, &executor.ExecutorConfig{
		// Not in the task's directory, where its user could have put a
		// symlink for root's executor to append to.
		LogFile:  filepath.Join(stateDir, executorLogName),
		LogLevel: "debug",
	})
	if err != nil {
		return nil, nil, fmt.Errorf("creating the executor: %w", err)
	}
	ps, err := exec.Launch(&executor.ExecCommand{
		Cmd:  d.self,
		Args: []string{SuperviseCommand, specPath},
		// The supervisor is root: its environment is built here from
		// nothing (the ranks get the task's from the spec), and so is
		// that of every command the executor runs in the task.
		Env: supervisor.RootEnv(cfg.AllocID, cfg.Name),
		// The supervisor keeps the client's identity and starts the ranks
		// as spec.RunAs itself (supervisor.Credential says why). Not the
		// executor's User either way: Nomad 1.6's executor gives such a
		// process GID 0 among its supplementary groups.
		User: "",
		// Cgroups put the supervisor and every worker in one tree, so task
		// stats and a stop cover all of them. Without device isolation the
		// /dev/nvidia* nodes stay usable under cgroups v2 (nomad#17200 is
		// about the isolating executor's device allow-list).
		// Without them (a client that is not root), the ranks' own process
		// groups outlive a stop of the supervisor's: the ranks die with the
		// supervisor (parent-death signal) and the driver kills their
		// groups once it is gone (killLeftovers).
		BasicProcessCgroup: d.cgroups,
		TaskDir:            cfg.TaskDir().Dir,
		StdoutPath:         cfg.StdoutPath,
		StderrPath:         cfg.StderrPath,
		NetworkIsolation:   cfg.NetworkIsolation,
	})
	if err != nil {
		pluginClient.Kill()
		return nil, nil, fmt.Errorf("launching the supervisor: %w", err)
	}

	// Its start time tells the supervisor from a later process given the
	// same PID, when the driver decides whether it is gone.
	superStart, _ := supervisor.ProcessStart(ps.Pid)
	h := d.newHandle(cfg, exec, pluginClient, ps.Pid, superStart, time.Now().Round(time.Millisecond), spec.GroupsFile, logger)
	h.runAs, h.stateDir = runAs, stateDir
	if spec.GPUIsolation != nil {
		h.devicesCgroup = spec.GPUIsolation.V1Cgroup
	}
	if spec.PidsLimit != nil {
		h.pidsCgroup = spec.PidsLimit.V1Cgroup
	}
	handle := drivers.NewTaskHandle(taskHandleVersion)
	handle.Config = cfg
	state := TaskState{
		ReattachConfig: pstructs.ReattachConfigFromGoPlugin(pluginClient.ReattachConfig()),
		TaskConfig:     cfg,
		Pid:            ps.Pid,
		PidStartTicks:  superStart,
		StartedAt:      h.startedAt,
		EventsFile:     spec.EventsFile,
		GroupsFile:     spec.GroupsFile,
		StateDir:       stateDir,
		RunAs:          runAs,
		DevicesCgroup:  h.devicesCgroup,
		PidsCgroup:     h.pidsCgroup,
	}
	if err := handle.SetDriverState(&state); err != nil {
		_ = exec.Shutdown("", 0)
		pluginClient.Kill()
		return nil, nil, fmt.Errorf("saving the task state: %w", err)
	}
	d.tasks.Set(cfg.ID, h)
	d.startHandle(h, spec.EventsFile, 0)
	started = true
	return handle, nil, nil
}

func (d *Driver) newHandle(cfg *drivers.TaskConfig, exec executor.Executor, pc *plugin.Client, pid int, pidStart uint64,
	started time.Time, groupsFile string, logger hclog.Logger) *taskHandle {
	return &taskHandle{
		exec: exec, pluginClient: pc, pid: pid, pidStart: pidStart, groupsFile: groupsFile, logger: logger,
		taskConfig: cfg, startedAt: started, procState: drivers.TaskStateRunning, doneCh: make(chan struct{}),
	}
}

// startHandle waits for the supervisor and relays its events as task events
// until it exits.
func (d *Driver) startHandle(h *taskHandle, eventsFile string, offset int64) {
	ctx, cancel := context.WithCancel(d.ctx)
	h.stopEvents = cancel
	followed := make(chan struct{})
	go func() {
		defer close(followed)
		// A container member's events file is in the allocation's shared
		// directory, which the container may rearrange below its root.
		trusted := ""
		var opened func()
		if h.relay != nil {
			trusted = filepath.Join(h.taskConfig.AllocDir, allocdir.SharedAllocName)
			opened = h.relay.specRead
		}
		budget := newEventBudget()
		err := followEvents(ctx, eventsFile, trusted, offset, opened, func(e taskevent.Event) {
			if budget.admit(time.Now(), &e) {
				d.emit(h.taskConfig, h.eventTask(), e)
			}
		})
		if err != nil {
			h.logger.Warn("not relaying the supervisor's events", "error", err)
		}
	}()
	go func() {
		if h.relay != nil {
			h.waitRelay()
		} else {
			h.run()
		}
		cancel() // the follower reads what is left, then ends
		<-followed
	}()
}

// emit turns a supervisor event into a Nomad task event: the message for
// people, and the event's fields as annotations, which the Nomad client
// stores as the task event's Details for the CLI (taskevent.Decode). task is
// the task the event is for: the Nomad client files a driver's events by
// allocation and task name, so a container member's sidecar tells them as
// the docker task's own.
func (d *Driver) emit(cfg *drivers.TaskConfig, task string, e taskevent.Event) {
	msg := e.Message
	if msg == "" {
		msg = e.Describe()
	}
	_ = d.eventer.EmitEvent(&drivers.TaskEvent{
		TaskID:      cfg.ID,
		TaskName:    task,
		AllocID:     cfg.AllocID,
		Timestamp:   e.Time,
		Message:     msg,
		Annotations: e.Encode(),
	})
}

func (d *Driver) RecoverTask(handle *drivers.TaskHandle) error {
	if handle == nil {
		return fmt.Errorf("recovering a task: no handle")
	}
	if _, ok := d.tasks.Get(handle.Config.ID); ok {
		return nil
	}
	var state TaskState
	if err := handle.GetDriverState(&state); err != nil {
		return fmt.Errorf("decoding the task state: %w", err)
	}
	if state.Container != nil {
		return d.recoverContainerMember(&state)
	}
	rc, err := pstructs.ReattachConfigToGoPlugin(state.ReattachConfig)
	if err != nil {
		return fmt.Errorf("reading the executor's reattach config: %w", err)
	}
	logger := d.logger.With("task", handle.Config.Name, "alloc_id", handle.Config.AllocID)
	groupsFile := state.GroupsFile
	if groupsFile == "" && state.EventsFile != "" { // state of an older driver
		groupsFile = filepath.Join(filepath.Dir(state.EventsFile), groupsFileName)
	}
	exec, pluginClient, err := executor.ReattachToExecutor(rc, logger)
	if err != nil {
		// Nomad gives the task up; whatever its ranks left must go too.
		if !processAlive(state.Pid, state.PidStartTicks) {
			killLeftovers(logger, groupsFile)
		}
		return fmt.Errorf("reattaching to the executor: %w", err)
	}
	h := d.newHandle(state.TaskConfig, exec, pluginClient, state.Pid, state.PidStartTicks, state.StartedAt, groupsFile, logger)
	h.runAs, h.devicesCgroup, h.pidsCgroup, h.stateDir = state.RunAs, state.DevicesCgroup, state.PidsCgroup, state.StateDir
	// A client that rebuilt the task's directories on its restart made them
	// world-writable again: the ranks' user's alone once more.
	if err := secureTaskDirs(state.TaskConfig, state.RunAs); err != nil {
		logger.Warn("the task's directories may be open to other users", "error", err)
	}
	if state.StateDir == "" && state.EventsFile != "" {
		// A task of an older driver keeps its files in its private
		// directory, which a client that rebuilt the task directory made
		// world-writable again.
		if err := securePrivateDir(filepath.Dir(state.EventsFile)); err != nil {
			logger.Warn("the task's private directory may be open to other users", "error", err)
		}
	}
	d.tasks.Set(state.TaskConfig.ID, h)
	// Events written while the client was down were already reported, or
	// are stale: follow from the end.
	d.startHandle(h, state.EventsFile, fileSize(state.EventsFile))
	logger.Info("reattached to the running supervisor", "pid", state.Pid)
	return nil
}

func (d *Driver) WaitTask(ctx context.Context, taskID string) (<-chan *drivers.ExitResult, error) {
	h, ok := d.tasks.Get(taskID)
	if !ok {
		return nil, drivers.ErrTaskNotFound
	}
	ch := make(chan *drivers.ExitResult)
	go func() {
		defer close(ch)
		select {
		case <-h.doneCh:
		case <-ctx.Done():
			return
		case <-d.ctx.Done():
			return
		}
		h.mu.RLock()
		res := h.exitResult.Copy()
		h.mu.RUnlock()
		select {
		case ch <- res:
		case <-ctx.Done():
		case <-d.ctx.Done():
		}
	}()
	return ch, nil
}

// StopTask signals the supervisor, which stops its workers (SIGTERM, grace,
// SIGKILL) and leaves the group before exiting, all within timeout (the
// task's kill_timeout): the driver first tells it when the executor's
// SIGKILL will come. Once the supervisor is gone, the driver kills whatever
// its ranks left (the handle does, as it sees it exit).
func (d *Driver) StopTask(taskID string, timeout time.Duration, signal string) error {
	h, ok := d.tasks.Get(taskID)
	if !ok {
		return drivers.ErrTaskNotFound
	}
	if h.relay != nil {
		h.relay.close()
		<-h.doneCh
		return nil
	}
	if signal == "" {
		signal = "SIGTERM"
	}
	if path := stopDeadlinePath(h.groupsFile); path != "" {
		if err := supervisor.WriteStopDeadline(path, time.Now().Add(timeout)); err != nil {
			// The supervisor falls back to its fixed grace.
			h.logger.Warn("the supervisor will not know the kill timeout", "error", err)
		}
	}
	if err := h.exec.Shutdown(signal, timeout); err != nil {
		if h.pluginClient.Exited() {
			if !processAlive(h.pid, h.pidStart) {
				killLeftovers(h.logger, h.groupsFile)
			}
			return nil
		}
		return fmt.Errorf("stopping the supervisor: %w", err)
	}
	<-h.doneCh
	h.pluginClient.Kill()
	return nil
}

// stopDeadlinePath is the stop deadline file beside the groups file (both in
// the task's private directory).
func stopDeadlinePath(groupsFile string) string {
	if groupsFile == "" {
		return ""
	}
	return filepath.Join(filepath.Dir(groupsFile), stopDeadlineFileName)
}

func (d *Driver) DestroyTask(taskID string, force bool) error {
	h, ok := d.tasks.Get(taskID)
	if !ok {
		return drivers.ErrTaskNotFound
	}
	if h.IsRunning() && !force {
		return fmt.Errorf("cannot destroy running task %s", taskID)
	}
	if h.relay != nil {
		h.relay.close()
		<-h.doneCh
		if err := os.RemoveAll(h.relay.runDir); err != nil {
			h.logger.Warn("removing the container member's run directory", "dir", h.relay.runDir, "error", err)
		}
		if h.stopEvents != nil {
			h.stopEvents()
		}
		d.tasks.Delete(taskID)
		return nil
	}
	if !h.pluginClient.Exited() {
		if err := h.exec.Shutdown("", 0); err != nil {
			h.logger.Error("destroying the executor failed", "error", err)
		}
		h.pluginClient.Kill()
	}
	if !processAlive(h.pid, h.pidStart) {
		killLeftovers(h.logger, h.groupsFile)
		for _, cg := range []string{h.devicesCgroup, h.pidsCgroup} {
			if err := supervisor.RemoveV1Cgroup(cg); err != nil {
				h.logger.Debug("removing the task's cgroup", "cgroup", cg, "error", err)
			}
		}
		if err := removeStateDir(h.stateDir); err != nil {
			h.logger.Warn("removing the task's state directory", "dir", h.stateDir, "error", err)
		}
	}
	if h.stopEvents != nil {
		h.stopEvents()
	}
	d.tasks.Delete(taskID)
	return nil
}

func (d *Driver) InspectTask(taskID string) (*drivers.TaskStatus, error) {
	h, ok := d.tasks.Get(taskID)
	if !ok {
		return nil, drivers.ErrTaskNotFound
	}
	return h.TaskStatus(), nil
}

// TaskStats covers the supervisor and every worker: they share the task's
// cgroup, which the executor samples.
func (d *Driver) TaskStats(ctx context.Context, taskID string, interval time.Duration) (<-chan *drivers.TaskResourceUsage, error) {
	h, ok := d.tasks.Get(taskID)
	if !ok {
		return nil, drivers.ErrTaskNotFound
	}
	if h.relay != nil {
		return relayStats(ctx, interval), nil
	}
	return h.exec.Stats(ctx, interval)
}

func (d *Driver) TaskEvents(ctx context.Context) (<-chan *drivers.TaskEvent, error) {
	return d.eventer.TaskEvents(ctx)
}

// SignalTask signals the supervisor, which passes the signal on to every
// local rank process (not its process group: the rank decides whether its
// children hear of it).
func (d *Driver) SignalTask(taskID string, signal string) error {
	h, ok := d.tasks.Get(taskID)
	if !ok {
		return drivers.ErrTaskNotFound
	}
	sig, ok := signals.SignalLookup[signal]
	if !ok {
		return fmt.Errorf("unknown signal %q", signal)
	}
	if h.relay != nil {
		// `nomad alloc signal` without -task signals every task; the
		// docker task's container has the supervisor, which passes it on.
		return nil
	}
	return h.exec.Signal(sig)
}

func (d *Driver) ExecTask(taskID string, cmd []string, timeout time.Duration) (*drivers.ExecTaskResult, error) {
	if len(cmd) == 0 {
		return nil, fmt.Errorf("exec: no command")
	}
	h, ok := d.tasks.Get(taskID)
	if !ok {
		return nil, drivers.ErrTaskNotFound
	}
	if h.relay != nil {
		return nil, errNoProcess(h)
	}
	cmd = d.asTaskUser(h, cmd)
	out, code, err := h.exec.Exec(time.Now().Add(timeout), cmd[0], cmd[1:])
	if err != nil {
		return nil, err
	}
	return &drivers.ExecTaskResult{Stdout: out, ExitResult: &drivers.ExitResult{ExitCode: code}}, nil
}

var _ drivers.ExecTaskStreamingRawDriver = (*Driver)(nil)

// ExecTaskStreamingRaw backs `nomad alloc exec`.
func (d *Driver) ExecTaskStreamingRaw(ctx context.Context, taskID string, command []string, tty bool,
	stream drivers.ExecTaskStream) error {
	if len(command) == 0 {
		return fmt.Errorf("exec: no command")
	}
	h, ok := d.tasks.Get(taskID)
	if !ok {
		return drivers.ErrTaskNotFound
	}
	if h.relay != nil {
		return errNoProcess(h)
	}
	return h.exec.ExecStreaming(ctx, d.asTaskUser(h, command), tty, stream)
}

// asTaskUser has a command run in the task (nomad alloc exec, script
// checks) run as the task's user: the executor would run it as the
// supervisor's, root.
func (d *Driver) asTaskUser(h *taskHandle, cmd []string) []string {
	if h.stateDir != "" {
		// With the task's environment, which the executor's (the root
		// supervisor's) lacks, and as the ranks' user.
		return append([]string{d.self, supervisor.RunAsCommand}, supervisor.RunAsArgs(filepath.Join(h.stateDir, specFileName), cmd)...)
	}
	if h.runAs == nil {
		return cmd
	}
	return append([]string{d.self, supervisor.RunAsCommand}, h.runAs.RunAsArgs(cmd)...)
}

// Shutdown stops the driver's goroutines; tasks keep running (their
// executors are separate processes) for the next client to recover.
func (d *Driver) Shutdown() { d.cancel() }
