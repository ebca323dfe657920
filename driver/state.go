package driver

import (
	"sync"
	"time"

	"github.com/hashicorp/nomad/plugins/drivers"
	pstructs "github.com/hashicorp/nomad/plugins/shared/structs"

	"github.com/gpujob/gpujob/driver/supervisor"
)

// taskHandleVersion is the version of TaskState; bump it when the shape
// changes so RecoverTask can refuse state it does not understand.
const taskHandleVersion = 1

// TaskState is what Nomad persists for a running task, so that after a client
// restart RecoverTask can reattach to the executor (and through it to the
// supervisor and its workers, which never stopped).
type TaskState struct {
	ReattachConfig *pstructs.ReattachConfig
	TaskConfig     *drivers.TaskConfig
	Pid            int
	PidStartTicks  uint64 // the supervisor's start time (/proc), 0 if unknown
	StartedAt      time.Time
	EventsFile     string
	GroupsFile     string // the ranks' process groups, for killLeftovers
	// StateDir is the task's state directory (statedir.go), with the
	// supervisor's spec; "" for a task of a driver that kept them in the
	// task's private directory.
	StateDir string
	// RunAs is the ranks' user, for commands run in the task; nil for the
	// supervisor's own (and for tasks of a driver that ran them as root).
	RunAs *supervisor.Credential
	// DevicesCgroup is the task's cgroups v1 devices cgroup, removed with
	// the task.
	DevicesCgroup string
	// PidsCgroup is its cgroups v1 pids cgroup (pids_limit), likewise.
	PidsCgroup string
	// Container is set for a container member's sidecar, which has no
	// executor to reattach to (ReattachConfig and Pid are unset).
	Container *ContainerState `json:",omitempty"`
}

// ContainerState is what a container member's sidecar needs after a client
// restart.
type ContainerState struct {
	Task   string // the docker task whose events it relays
	RunDir string // what the container mounts
}

// taskStore holds the handles of the tasks this driver runs.
type taskStore struct {
	mu    sync.RWMutex
	store map[string]*taskHandle
}

func newTaskStore() *taskStore { return &taskStore{store: map[string]*taskHandle{}} }

func (s *taskStore) Set(id string, h *taskHandle) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.store[id] = h
}

func (s *taskStore) Get(id string) (*taskHandle, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	h, ok := s.store[id]
	return h, ok
}

// each calls fn for every handle, under the store's lock.
func (s *taskStore) each(fn func(*taskHandle)) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, h := range s.store {
		fn(h)
	}
}

func (s *taskStore) Delete(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.store, id)
}
