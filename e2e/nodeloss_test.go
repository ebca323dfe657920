package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// clientOf is the dev-cluster client number of a node name
// (gpujob-dev-client-N).
func (c *cluster) clientOf(t *testing.T, node string) int {
	n, err := strconv.Atoi(node[strings.LastIndex(node, "-")+1:])
	if err != nil {
		t.Fatalf("node %q is not a dev-cluster client", node)
	}
	return n
}

// loseMachineFor is loseMachine for a test on a shared cluster: the client
// comes back (a new node, its old allocations lost) when t ends.
func (c *cluster) loseMachineFor(t *testing.T, n int) error {
	t.Cleanup(func() {
		if out, err := c.script("dev-client.sh", "start", strconv.Itoa(n)); err != nil {
			t.Errorf("starting client %d again: %v\n%s", n, err, out)
		}
	})
	return c.loseMachine(n)
}

// loseMachine kills client n's agent, then every process that works in its
// data dir (executors, logmons, supervisors, ranks): what a machine's loss
// looks like from the rest of the cluster.
func (c *cluster) loseMachine(n int) error {
	if _, err := c.script("dev-client.sh", "kill", strconv.Itoa(n)); err != nil {
		return err
	}
	home := filepath.Join(c.dir, fmt.Sprintf("client-%d", n))
	procs, _ := filepath.Glob("/proc/[0-9]*/cwd")
	killed := 0
	for _, p := range procs {
		cwd, err := os.Readlink(p)
		if err != nil || !strings.HasPrefix(cwd, home) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			killed++
		}
	}
	if killed == 0 {
		return fmt.Errorf("no process worked in %s", home)
	}
	return nil
}
