package supervisor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// PidsLimit caps the processes and threads of a task (the supervisor, its
// ranks and everything they start) with the cgroup pids controller, so that
// a fork bomb in a job exhausts its own allowance, not the machine's PIDs,
// which every other tenant's task and the Nomad client need too. Nomad 1.6's
// executor sets no such limit.
type PidsLimit struct {
	Max int `json:"max"`
	// V1Cgroup is the pids cgroup the supervisor creates and enters on a
	// cgroups v1 host; empty on a cgroups v2 host, where the task's own
	// cgroup, which Nomad made, gets the limit.
	V1Cgroup string `json:"v1_cgroup,omitempty"`
}

// limitPids applies l to this process and every process it starts from now
// on. cleanup undoes what only the supervisor can (a cgroups v1 cgroup it
// made); call it once the ranks are gone.
func limitPids(l *PidsLimit) (cleanup func(), err error) {
	cleanup = func() {}
	if l.Max <= 0 {
		return cleanup, nil
	}
	if unified() {
		dir, err := ownV2Cgroup()
		if err != nil {
			return cleanup, err
		}
		return cleanup, writePidsMax(dir, l.Max)
	}
	if l.V1Cgroup == "" {
		return cleanup, errors.New("the node has neither cgroups v2 nor a cgroups v1 pids controller")
	}
	if err := os.Mkdir(l.V1Cgroup, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return cleanup, fmt.Errorf("creating the pids cgroup %s: %w", l.V1Cgroup, err)
	}
	if err := writePidsMax(l.V1Cgroup, l.Max); err != nil {
		return cleanup, err
	}
	pid := os.Getpid()
	if err := writeProcs(l.V1Cgroup, pid); err != nil {
		return cleanup, err
	}
	return func() {
		_ = writeProcs(filepath.Dir(l.V1Cgroup), pid)
		_ = os.Remove(l.V1Cgroup)
	}, nil
}

func writePidsMax(dir string, max int) error {
	if err := os.WriteFile(filepath.Join(dir, "pids.max"), []byte(strconv.Itoa(max)), 0); err != nil {
		return fmt.Errorf("limiting the task to %d processes in %s: %w", max, dir, err)
	}
	return nil
}
