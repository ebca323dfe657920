package driver

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	plugin "github.com/hashicorp/go-plugin"
	"github.com/hashicorp/nomad/drivers/shared/executor"
	"github.com/hashicorp/nomad/plugins/drivers"

	"github.com/gpujob/gpujob/driver/supervisor"
	"github.com/gpujob/gpujob/internal/containermember"
)

// taskHandle is one running task: the executor that runs the supervisor.
type taskHandle struct {
	exec         executor.Executor
	pluginClient *plugin.Client
	pid          int
	pidStart     uint64 // the supervisor's start ticks, 0 if unknown
	groupsFile   string // where the supervisor records its ranks' process groups
	runAs        *supervisor.Credential
	// stateDir is the task's state directory (statedir.go); "" for a task
	// of an older driver, whose files are in its private directory.
	stateDir string
	// devicesCgroup is the cgroups v1 devices cgroup of the task, if any.
	devicesCgroup string
	// pidsCgroup is its cgroups v1 pids cgroup, if any.
	pidsCgroup string
	logger     hclog.Logger
	taskConfig *drivers.TaskConfig
	startedAt  time.Time
	// relay is set for a container member's sidecar, which runs no
	// process (container.go); exec, pluginClient and pid are then unset.
	relay *relay
	// stopEvents ends the goroutine that turns the supervisor's events into
	// task events.
	stopEvents context.CancelFunc

	mu          sync.RWMutex
	procState   drivers.TaskState
	completedAt time.Time
	exitResult  *drivers.ExitResult
	doneCh      chan struct{}
}

func (h *taskHandle) TaskStatus() *drivers.TaskStatus {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return &drivers.TaskStatus{
		ID:               h.taskConfig.ID,
		Name:             h.taskConfig.Name,
		State:            h.procState,
		StartedAt:        h.startedAt,
		CompletedAt:      h.completedAt,
		ExitResult:       h.exitResult,
		DriverAttributes: h.driverAttributes(),
	}
}

func (h *taskHandle) driverAttributes() map[string]string {
	if h.relay != nil {
		return map[string]string{"container_task": h.relay.task}
	}
	return map[string]string{"pid": strconv.Itoa(h.pid)}
}

func (h *taskHandle) IsRunning() bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.procState == drivers.TaskStateRunning
}

// run waits for the supervisor to exit and records how. Once the supervisor
// is gone nothing stops its ranks' leftovers (with cgroups the executor
// already killed them; without, their process groups survive the
// supervisor's), so it kills them before the task counts as exited.
func (h *taskHandle) run() {
	defer close(h.doneCh)
	ps, err := h.exec.Wait(context.Background())
	// Wait also fails when the executor is lost while the supervisor runs
	// on: its ranks are then not leftovers.
	if !processAlive(h.pid, h.pidStart) {
		killLeftovers(h.logger, h.groupsFile)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.completedAt = time.Now()
	if err != nil {
		h.exitResult = &drivers.ExitResult{Err: err}
		h.procState = drivers.TaskStateUnknown
		return
	}
	h.exitResult = &drivers.ExitResult{ExitCode: ps.ExitCode, Signal: ps.Signal}
	h.procState = drivers.TaskStateExited
}

// relay is a container member's sidecar: it relays the events of the
// supervisor in task's container until Nomad stops it.
type relay struct {
	task     string // the docker task whose events these are
	runDir   string // what the container mounts, removed with the task
	stopOnce sync.Once
	stop     chan struct{}
	logger   hclog.Logger
}

func (r *relay) close() { r.stopOnce.Do(func() { close(r.stop) }) }

// specRead removes the spec from the run directory once the supervisor in
// the container has read it (it creates its events file after that): the
// spec holds the Consul token, and whoever may `nomad alloc exec` into the
// container is root there. The supervisor never reads it again; a container
// started again without its sidecar fails, saying the spec is missing.
func (r *relay) specRead() {
	if err := os.Remove(filepath.Join(r.runDir, containermember.SpecName)); err != nil && !os.IsNotExist(err) {
		r.logger.Warn("removing the container member's spec", "error", err)
	}
}

// waitRelay is run for a sidecar: it ends, successfully, when Nomad stops
// the task (once the group's main tasks are over, or the allocation stops).
func (h *taskHandle) waitRelay() {
	defer close(h.doneCh)
	<-h.relay.stop
	h.mu.Lock()
	defer h.mu.Unlock()
	h.completedAt = time.Now()
	h.exitResult = &drivers.ExitResult{ExitCode: 0}
	h.procState = drivers.TaskStateExited
}

// eventTask is the task whose events the handle relays: the docker task for
// a container member, else its own.
func (h *taskHandle) eventTask() string {
	if h.relay != nil {
		return h.relay.task
	}
	return h.taskConfig.Name
}

// processAlive reports whether pid still runs and, when start is known, is
// the process that started then (not a later one given the same PID). A
// zombie has exited.
func processAlive(pid int, start uint64) bool {
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return false
	}
	got, err := supervisor.ProcessStart(pid)
	if err != nil {
		return false
	}
	if start != 0 && got != start {
		return false
	}
	return !supervisor.IsZombie(pid)
}

// killLeftovers kills the process groups the supervisor recorded that still
// hold its ranks or their children.
func killLeftovers(logger hclog.Logger, groupsFile string) {
	if groupsFile == "" {
		return
	}
	killed, err := supervisor.KillGroups(groupsFile)
	if len(killed) > 0 {
		logger.Info("killed the process groups the supervisor's ranks left", "pgids", killed)
	}
	if err != nil {
		logger.Warn("killing the ranks' leftover processes", "error", err)
	}
}
