package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
)

// TestNodeLossMovesTheMemberAndTrainingResumes loses a whole machine in the
// middle of training: one of two clients dies with its tasks (agent,
// executors, supervisor, ranks). Consul's session TTL ends the round for the
// survivor, Nomad's heartbeat marks the node down and places a replacement on
// the free GPU of the other node, and the group trains on from its last
// checkpoint.
func TestNodeLossMovesTheMemberAndTrainingResumes(t *testing.T) {
	needCluster(t)
	c := startClusterWith(2, 2, 12000)
	t.Cleanup(func() {
		if err := c.stop(); err != nil {
			t.Errorf("stopping the two-client cluster: %v", err)
		}
	})
	if c.failed != "" {
		t.Fatalf("two-client cluster did not start: %s", c.failed)
	}

	job := c.trainJob(t, "e2e-node-loss", 2, 1, []string{"--steps", "300", "--sleep-per-step", "0.05"},
		`join_timeout = "3m"`)
	// One member per node to start with.
	weight := int8(100)
	job.AddSpread(&api.Spread{Attribute: "${node.unique.id}", Weight: &weight})
	c.register(t, job)

	running := c.waitAllocs(t, ctx(t, time.Minute), "e2e-node-loss", "both members running",
		func(as []*api.AllocationListStub) bool {
			return len(as) == 2 && allIn(api.AllocClientStatusRunning)(as) && as[0].NodeID != as[1].NodeID
		})
	if err := c.waitCheckpoint("e2e-node-loss", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	victim := running[1]
	client := c.clientOf(t, victim.NodeName)
	lost := time.Now()
	c.loseMachine(t, client)
	t.Logf("killed client %d (%s) with member %s at its checkpoint", client, victim.NodeName, victim.Name)

	// The group finishes with a replacement for the lost member.
	allocs := c.waitAllocs(t, ctx(t, 4*time.Minute), "e2e-node-loss", "a replacement and the end of training",
		func(as []*api.AllocationListStub) bool {
			complete := 0
			for _, a := range as {
				if a.ClientStatus == api.AllocClientStatusComplete {
					complete++
				}
				if a.ClientStatus == api.AllocClientStatusFailed {
					return true
				}
			}
			return complete == 2
		})
	var replacement *api.AllocationListStub
	for _, a := range allocs {
		if a.ClientStatus == api.AllocClientStatusFailed {
			t.Fatalf("%s failed:\n%s", a.Name, c.taskEvents(t, allocs))
		}
		if a.ClientStatus == api.AllocClientStatusComplete && a.Name == victim.Name {
			replacement = a
		}
	}
	if replacement == nil || replacement.ID == victim.ID || replacement.NodeID == victim.NodeID {
		t.Fatalf("no replacement for %s on the surviving node: %s", victim.Name, describeAllocs(allocs))
	}
	t.Logf("replacement %s ran on %s; group done %s after the loss", replacement.ID[:8], replacement.NodeName,
		time.Since(lost).Round(time.Second))

	var res result
	for _, a := range allocs {
		if a.ClientStatus != api.AllocClientStatusComplete {
			continue
		}
		if out := c.taskLog(t, a.ID, "train", "stdout"); strings.Contains(out, "gpujob-result: ") {
			res = parseResult(t, out)
		}
	}
	if res.RestartCount < 1 || res.ResumedFromStep == 0 || res.WorldSize != 2 {
		t.Errorf("after the node loss: %+v; want a restart that resumed from a checkpoint with 2 workers", res)
	}
	// The survivor hears of the loss either from its own rank (its
	// collective with the dead peer breaks) or from the rendezvous (the
	// dead member's session expires), whichever comes first.
	if ev := c.taskEvents(t, allocs); !strings.Contains(ev, "restarting group") && !strings.Contains(ev, "restarting with the group") {
		t.Errorf("the survivor's events do not tell of the restart:\n%s", ev)
	}
}

// clientOf is the dev-cluster client number of a node name
// (gpujob-dev-client-N).
func (c *cluster) clientOf(t *testing.T, node string) int {
	n, err := strconv.Atoi(node[strings.LastIndex(node, "-")+1:])
	if err != nil {
		t.Fatalf("node %q is not a dev-cluster client", node)
	}
	return n
}

// loseMachine kills client n's agent, then every process that works in its
// data dir (executors, logmons, supervisors, ranks): what a machine's loss
// looks like from the rest of the cluster.
func (c *cluster) loseMachine(t *testing.T, n int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(c.repo, "scripts", "dev-client.sh"), "kill", strconv.Itoa(n))
	cmd.Env = append(os.Environ(), "GPUJOB_DEV_DIR="+c.dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("killing client %d: %v\n%s", n, err, out)
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
		t.Fatalf("no process worked in %s", home)
	}
}
