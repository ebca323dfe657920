package driver

import (
	"context"
	"strconv"
	"sync"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	plugin "github.com/hashicorp/go-plugin"
	"github.com/hashicorp/nomad/drivers/shared/executor"
	"github.com/hashicorp/nomad/plugins/drivers"
)

// taskHandle is one running task: the executor that runs the supervisor.
type taskHandle struct {
	exec         executor.Executor
	pluginClient *plugin.Client
	pid          int
	logger       hclog.Logger
	taskConfig   *drivers.TaskConfig
	startedAt    time.Time
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

// run waits for the supervisor to exit and records how.
func (h *taskHandle) run() {
	defer close(h.doneCh)
	ps, err := h.exec.Wait(context.Background())
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
