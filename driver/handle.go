package driver

import (
	"context"
	"strconv"
	"sync"
	"syscall"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	plugin "github.com/hashicorp/go-plugin"
	"github.com/hashicorp/nomad/drivers/shared/executor"
	"github.com/hashicorp/nomad/plugins/drivers"

	"github.com/gpujob/gpujob/driver/supervisor"
)

// taskHandle is one running task: the executor that runs the supervisor.
type taskHandle struct {
	exec         executor.Executor
	pluginClient *plugin.Client
	pid          int
	pidStart     uint64 // the supervisor's start ticks, 0 if unknown
	groupsFile   string // where the supervisor records its ranks' process groups
	runAs        *supervisor.Credential
	// devicesCgroup is the cgroups v1 devices cgroup of the task, if any.
	devicesCgroup string
	logger        hclog.Logger
	taskConfig    *drivers.TaskConfig
	startedAt     time.Time
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
		DriverAttributes: map[string]string{"pid": strconv.Itoa(h.pid)},
	}
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
