package driver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/client/allocdir"
	"github.com/hashicorp/nomad/plugins/drivers"
	"golang.org/x/sys/unix"

	"github.com/gpujob/gpujob/driver/supervisor"
	"github.com/gpujob/gpujob/internal/containermember"
	"github.com/gpujob/gpujob/internal/safename"
)

// A container member is one member of a training group whose supervisor runs
// inside a container that Nomad's own docker driver starts. The gpujob driver
// then runs no process of its own for the member: its task (a prestart
// sidecar of the same group, container_task naming the docker task) does
// what StartTask does for a host member up to the launch — the supervisor's
// spec with the rendezvous, Consul and checkpoint settings, the checkpoint
// directory made and owned — and hands the container two files through a
// read-only bind mount: the spec and a static supervisor binary. While the
// member lives it relays the supervisor's events, which the supervisor
// appends in the allocation's shared directory, as task events of the docker
// task, so that the CLI reads one story whichever driver ran the member.
//
// Why a sidecar and not the docker task alone: the spec holds what only the
// client should know (the Consul token and TLS material, the checkpoint root,
// who the ranks run as), the checkpoint directory must exist with the ranks'
// owner before the container mounts it, and only a task driver can add
// structured events to a task.

// validAllocID is Nomad's allocation ID (a UUID): it names a directory.
var validAllocID = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// containerPlan is what a container member's sidecar prepares.
type containerPlan struct {
	task       string // the docker task's name
	runDir     string // RunRoot/<alloc ID>: the spec and the supervisor
	eventsFile string // the events file on the host
	// killTimeout is the docker task's kill_timeout (container_kill_timeout;
	// 0 when the config has none), for the spec.
	killTimeout time.Duration
}

// Bounds of container_kill_timeout: those of a spec's checkpoint_grace,
// which `gpujob render` writes into both the docker task's kill_timeout
// and the sidecar's container_kill_timeout. Docker counts whole seconds
// (supervisor.dockerKillTimeout), so less than a second is no grace at all.
const (
	minContainerKillTimeout = time.Second
	maxContainerKillTimeout = 10 * time.Minute
)

// containerKillTimeout parses container_kill_timeout. How a stop of the
// docker task reaches the member: Nomad's docker driver runs `docker stop`
// with the task's kill_timeout, and the gpujob driver hears nothing of it
// (Nomad stops a group's prestart sidecars after its main tasks), so it
// cannot write the supervisor a deadline as it does for a host member.
// The supervisor reckons one from when the stop signal came and this
// value, which reaches it in the spec, in the run directory the container
// mounts read-only: nothing in the container can change it once the
// member has started. It is the job's word all the same, as the docker
// task's kill_timeout is; it only plans the supervisor's own steps, never
// delays the SIGKILL, which docker sends at the kill_timeout Nomad gives.
func containerKillTimeout(tc *TaskConfig) (time.Duration, error) {
	if tc.ContainerKillTimeout == "" {
		// A job rendered before container_kill_timeout, or by hand: the
		// supervisor's fixed grace.
		return 0, nil
	}
	d, err := duration("container_kill_timeout", tc.ContainerKillTimeout, 0)
	if err != nil {
		return 0, err
	}
	if d < minContainerKillTimeout || d > maxContainerKillTimeout {
		return 0, fmt.Errorf("container_kill_timeout: %s is not between %s and %s (set it to the docker task's kill_timeout)",
			d, minContainerKillTimeout, maxContainerKillTimeout)
	}
	return d, nil
}

// planContainer checks a container member's config against the task and
// the plugin config, and says where its files go.
func planContainer(cfg *drivers.TaskConfig, tc *TaskConfig, pc *Config, runRoot string) (*containerPlan, error) {
	switch t := tc.ContainerTask; {
	case t == cfg.Name:
		return nil, fmt.Errorf("container_task: %q is this task; name the group's docker task that runs the member", t)
	case !validAllocID.MatchString(cfg.AllocID):
		return nil, fmt.Errorf("allocation ID %q is not a UUID; refusing to name a directory after it", cfg.AllocID)
	case !safename.IsPlain(firstOf(cfg.JobID, cfg.JobName)) || !safename.IsPlain(firstOf(cfg.Namespace, "default")):
		// The docker task mounts <root>/${NOMAD_NAMESPACE}/${NOMAD_JOB_ID}:
		// the raw names, which are the driver's only when they need no
		// encoding (every name gpujob renders).
		return nil, fmt.Errorf("job %q in namespace %q: a container member needs a job ID and namespace that are safe path segments "+
			"(letters, digits, '.', '_', '-'), because the container mounts its checkpoint directory by them", firstOf(cfg.JobID, cfg.JobName), cfg.Namespace)
	case cfg.AllocDir == "":
		return nil, fmt.Errorf("the task has no allocation directory for the container's events")
	}
	kill, err := containerKillTimeout(tc)
	if err != nil {
		return nil, err
	}
	if tc.CheckpointRoot != "" && filepath.Clean(tc.CheckpointRoot) != filepath.Clean(pc.CheckpointRoot) {
		return nil, fmt.Errorf("checkpoint_root: the job mounts checkpoints from %q into the container, but this client keeps them under %q "+
			"(the driver's checkpoint_root); render the job again with GPUJOB_CHECKPOINT_ROOT=%s", tc.CheckpointRoot, pc.CheckpointRoot, pc.CheckpointRoot)
	}
	return &containerPlan{
		task:   tc.ContainerTask,
		runDir: filepath.Join(runRoot, cfg.AllocID),
		eventsFile: filepath.Join(cfg.AllocDir, allocdir.SharedAllocName, containermember.EventsDir,
			safename.Encode(tc.ContainerTask)+".events"),
		killTimeout: kill,
	}, nil
}

// containerSpec turns a host member's spec into the container's: the events
// go to the shared directory as the container sees it; the driver, which
// does not run the supervisor, neither records rank groups nor writes stop
// deadlines (the container's end kills every rank), so the supervisor gets
// the docker task's kill timeout to reckon its own from (killTimeout, 0 for
// none: the fixed grace); the container's devices
// are the reservation's alone, so there is no device cgroup to set up, and
// the reservation's CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES reach
// the ranks through the container's environment.
func containerSpec(s *supervisor.Spec, task string, killTimeout time.Duration) {
	s.EventsFile = containermember.EventsFile(safename.Encode(task))
	s.GroupsFile = ""
	s.StopDeadlineFile = ""
	s.KillTimeout = supervisor.Duration(killTimeout)
	s.GPUIsolation = nil
	s.PidsLimit = nil // the docker driver's own pids_limit applies in a container
	s.VisibleDevices = nil
	s.Container = true
}

// startContainerMember is StartTask for a container member's sidecar.
func (d *Driver) startContainerMember(cfg *drivers.TaskConfig, tc *TaskConfig, pc *Config, runAs *supervisor.Credential) (_ *drivers.TaskHandle, _ *drivers.DriverNetwork, err error) {
	plan, err := planContainer(cfg, tc, pc, d.runRoot)
	if err != nil {
		return nil, nil, fmt.Errorf("gpujob task config: %w", err)
	}
	// One sidecar per allocation: the run directory is the allocation's.
	if other := d.relayOf(plan.runDir); other != "" {
		return nil, nil, fmt.Errorf("gpujob task config: task %q of this allocation already prepares a container member; a group has one", other)
	}
	spec, err := buildSpec(cfg, tc, pc, os.Getenv)
	if err != nil {
		return nil, nil, fmt.Errorf("gpujob task config: %w", err)
	}
	if err := inlineConsulTLS(&spec.Consul, os.ReadFile); err != nil {
		return nil, nil, fmt.Errorf("nomad-driver-gpujob plugin config: %w", err)
	}
	spec.RunAs = runAs
	spec.HostEnv = allowedAgentEnv(agentEnviron(os.Environ()), pc.hostEnv)
	containerSpec(spec, plan.task, plan.killTimeout)
	if err := secureTaskDirs(cfg, runAs); err != nil {
		return nil, nil, err
	}
	if err := prepareCheckpointDir(pc.CheckpointRoot, spec.CheckpointDir, runAs); err != nil {
		return nil, nil, err
	}
	// The supervisor checks that its checkpoint directory is this one, not
	// a directory of the container's that merely has its path.
	var st unix.Stat_t
	if err := unix.Stat(spec.CheckpointDir, &st); err != nil {
		return nil, nil, fmt.Errorf("checkpoint directory: %w", err)
	}
	spec.CheckpointDirID = fmt.Sprintf("%d:%d", st.Dev, st.Ino)
	// Nothing of the member's may outlive a failed start: the run
	// directory holds the Consul token.
	defer func() {
		if err != nil {
			_ = os.RemoveAll(plan.runDir)
		}
	}()
	if err := writeRunDir(plan.runDir, pc.ContainerSupervisor, spec); err != nil {
		return nil, nil, err
	}
	// Root's, writable by root alone (the relay refuses anything else):
	// the supervisor in the container is root (the docker task runs as
	// user 0). An events file left by the allocation's last start was
	// relayed then; the new supervisor's file appearing tells that it has
	// read its spec (relay.specRead).
	if err := ensureRootDir(cfg.AllocDir, filepath.Join(allocdir.SharedAllocName, containermember.EventsDir)); err != nil {
		return nil, nil, fmt.Errorf("preparing the container's events directory: %w", err)
	}
	if err := os.Remove(plan.eventsFile); err != nil && !os.IsNotExist(err) {
		return nil, nil, fmt.Errorf("clearing the last start's events: %w", err)
	}

	logger := d.logger.With("task", cfg.Name, "alloc_id", cfg.AllocID, "container_task", plan.task)
	h := d.newRelayHandle(cfg, plan, time.Now().Round(time.Millisecond), logger)
	handle := drivers.NewTaskHandle(taskHandleVersion)
	handle.Config = cfg
	state := TaskState{
		TaskConfig: cfg,
		StartedAt:  h.startedAt,
		EventsFile: plan.eventsFile,
		Container:  &ContainerState{Task: plan.task, RunDir: plan.runDir},
	}
	if err := handle.SetDriverState(&state); err != nil {
		return nil, nil, fmt.Errorf("saving the task state: %w", err)
	}
	d.tasks.Set(cfg.ID, h)
	d.startHandle(h, plan.eventsFile, 0)
	logger.Debug("prepared a container member", "run_dir", plan.runDir)
	return handle, nil, nil
}

// writeRunDir fills RunRoot/<alloc ID> with the spec (root's, 0600: it
// holds the Consul token) and a copy of the static supervisor. Each file is
// written beside its name and renamed, so a container that starts early
// never sees half a file.
func writeRunDir(dir, supervisorBin string, spec *supervisor.Spec) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("securing %s: %w", dir, err)
	}
	if err := copyExecutable(supervisorBin, filepath.Join(dir, containermember.SupervisorName)); err != nil {
		return fmt.Errorf("container_supervisor: %w (build it with `make build`; it is bin/gpujob-supervisor)", err)
	}
	tmp := filepath.Join(dir, "."+containermember.SpecName)
	if err := supervisor.WriteSpec(tmp, spec); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, containermember.SpecName)); err != nil {
		return fmt.Errorf("placing the supervisor spec: %w", err)
	}
	return nil
}

// copyExecutable copies the binary at src to dst, mode 0755.
func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", src)
	}
	tmp := dst + ".tmp"
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		os.Remove(tmp)
		return fmt.Errorf("copying %s: %w", src, err)
	}
	if err := out.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, dst)
}

// newRelayHandle is the handle of a container member's sidecar: no process,
// only the relay of the container's events, until Nomad stops it.
func (d *Driver) newRelayHandle(cfg *drivers.TaskConfig, plan *containerPlan, started time.Time, logger hclog.Logger) *taskHandle {
	return &taskHandle{
		logger: logger, taskConfig: cfg, startedAt: started, procState: drivers.TaskStateRunning,
		doneCh: make(chan struct{}),
		relay:  &relay{task: plan.task, runDir: plan.runDir, stop: make(chan struct{}), logger: logger},
	}
}

// relayStats reports an idle task: the sidecar runs no process, and Nomad's
// stats hook expects a stream until the task ends.
func relayStats(ctx context.Context, interval time.Duration) <-chan *drivers.TaskResourceUsage {
	ch := make(chan *drivers.TaskResourceUsage)
	go func() {
		defer close(ch)
		t := time.NewTicker(max(interval, time.Second))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				u := &drivers.TaskResourceUsage{
					ResourceUsage: &drivers.ResourceUsage{MemoryStats: &drivers.MemoryStats{}, CpuStats: &drivers.CpuStats{}},
					Timestamp:     now.UnixNano(),
				}
				select {
				case ch <- u:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return ch
}

// recoverContainerMember is RecoverTask for a container member's sidecar:
// the relay starts again from the events file's end (what was written while
// the client was down was told already, or is stale).
func (d *Driver) recoverContainerMember(state *TaskState) error {
	cfg := state.TaskConfig
	if filepath.Dir(state.Container.RunDir) != d.runRoot || filepath.Base(state.Container.RunDir) != cfg.AllocID {
		return fmt.Errorf("the recovered state names run directory %q, not %s/%s", state.Container.RunDir, d.runRoot, cfg.AllocID)
	}
	logger := d.logger.With("task", cfg.Name, "alloc_id", cfg.AllocID, "container_task", state.Container.Task)
	plan := &containerPlan{task: state.Container.Task, runDir: state.Container.RunDir, eventsFile: state.EventsFile}
	h := d.newRelayHandle(cfg, plan, state.StartedAt, logger)
	d.tasks.Set(cfg.ID, h)
	d.startHandle(h, plan.eventsFile, fileSize(plan.eventsFile))
	logger.Info("relaying the container member's events again")
	return nil
}

// errNoProcess answers exec into a sidecar, which has no process to run in.
func errNoProcess(h *taskHandle) error {
	return fmt.Errorf("task %q runs no process: it prepares the member whose supervisor runs in task %q; exec into that task",
		h.taskConfig.Name, h.relay.task)
}

// relayOf names the task of another live sidecar with run directory dir,
// "" if none.
func (d *Driver) relayOf(dir string) string {
	name := ""
	d.tasks.each(func(h *taskHandle) {
		if h.relay != nil && h.relay.runDir == dir && h.IsRunning() {
			name = h.taskConfig.Name
		}
	})
	return name
}

// ensureRootDir makes rel, below the allocation directory allocDir, a
// directory of root's, mode 0755, created if missing: the container's
// events directory in the shared directory, which the task's user can
// write. Every step goes through file descriptors, never following a
// symlink, and a directory the task's user made in its place is refused
// rather than removed by path (a path root walks twice can be swapped in
// between).
func ensureRootDir(allocDir, rel string) error {
	name := filepath.Base(rel)
	return withDirBeneath(allocDir, filepath.Dir(rel), func(parent int) error {
		if err := unix.Mkdirat(parent, name, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			return err
		}
		fd, err := openBeneath(parent, name, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC)
		if err != nil {
			return fmt.Errorf("%s is not a plain directory (a symlink or something else was put there): %w", rel, err)
		}
		defer unix.Close(fd)
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return err
		}
		if st.Uid != 0 {
			return fmt.Errorf("%s belongs to UID %d, not root: something of the task's made it in the driver's place", rel, st.Uid)
		}
		return unix.Fchmod(fd, 0o755)
	})
}
