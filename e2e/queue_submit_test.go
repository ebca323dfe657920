package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/queue/admit"
)

// partialGang follows job id's allocations until all members hold
// resources at once (or limit passes), and adds up the GPU-seconds its
// members held while the gang was not yet whole: what a partly placed gang
// keeps idle, since the driver starts no rank before every member has
// joined. It samples every 100 ms; each sample counts the time since the
// last one at the GPUs held then.
func (c *cluster) partialGang(t *testing.T, id string, members, gpusEach int, limit time.Duration) (idleGPUSeconds float64, whole time.Time) {
	t.Helper()
	deadline := time.Now().Add(limit)
	last := time.Now()
	maxHeld := 0
	for {
		held := 0
		as, err := c.allocsOf(id)
		if err != nil {
			t.Fatalf("allocations of %s: %v", id, err)
		}
		for _, a := range as {
			if a.DesiredStatus == api.AllocDesiredStatusRun &&
				(a.ClientStatus == api.AllocClientStatusPending || a.ClientStatus == api.AllocClientStatusRunning) {
				held++
			}
		}
		now := time.Now()
		if held >= members {
			return idleGPUSeconds, now
		}
		idleGPUSeconds += float64(held*gpusEach) * now.Sub(last).Seconds()
		last, maxHeld = now, max(maxHeld, held)
		if now.After(deadline) {
			t.Fatalf("job %s never held all %d members at once within %s (at most %d; %.1f GPU-seconds held idle)",
				id, members, limit, maxHeld, idleGPUSeconds)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// queueSpecFile writes a train spec whose members sleep for secs.
func queueSpecFile(t *testing.T, name string, workers, secs int) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name+".hcl")
	if err := os.WriteFile(p, []byte(queueTrainSpec(name, workers, secs)), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// waitHolding waits until job id holds n allocations.
func (c *cluster) waitHolding(t *testing.T, id string, n int, limit time.Duration) {
	t.Helper()
	queueWait(t, limit, fmt.Sprintf("%d allocations of %s holding", n, id), func() (bool, string) {
		h := c.holding(t, id)
		return len(h) == n, fmt.Sprintf("%d holding", len(h))
	})
}

// The scenario, through gpujob submit on two clients of two GPUs:
// while a 2-GPU job runs, a 4-worker job is submitted. Straight to Nomad
// (no queue configuration), Nomad places the two members that fit and
// they hold their GPUs idle until the first job ends; in queue mode the
// job waits in its queue, holding nothing, with its place and reason
// shown by status and list, and is admitted whole when the first ends. A
// third job stopped while queued is withdrawn and never reaches Nomad.
func TestQueueGangHoldsNoGPUsIdle(t *testing.T) {
	c := pairCluster(t)
	cc := c.consulClient(t)
	const (
		gpus    = 4 // two clients of two
		runSecs = 15
	)
	names := []string{"e2e-plain-a", "e2e-plain-b", "e2e-qgang-a", "e2e-qgang-b", "e2e-qgang-c"}
	c.resetQueues(t, cc) // nothing of another test's queues
	t.Cleanup(func() { c.resetQueues(t, cc, names...) })
	env := c.queueEnv()
	submit := func(name string, workers, secs int) string {
		t.Helper()
		out, errOut, code := c.gpujobEnv(t, env, 2*time.Minute, "submit", "--detach", queueSpecFile(t, name, workers, secs))
		if code != 0 {
			t.Fatalf("gpujob submit %s exited %d:\n%s%s", name, code, out, errOut)
		}
		return out + errOut
	}

	// Without queues: the anchor.
	submit("e2e-plain-a", 2, runSecs)
	c.waitHolding(t, "e2e-plain-a", 2, 2*time.Minute)
	start := time.Now()
	submit("e2e-plain-b", 4, 3)
	plainIdle, plainWhole := c.partialGang(t, "e2e-plain-b", 4, 1, 3*time.Minute)
	t.Logf("plain Nomad: the 4-worker job held %.1f GPU-seconds idle while partly placed; whole %s after its submit",
		plainIdle, plainWhole.Sub(start).Round(100*time.Millisecond))
	if plainIdle < 2 {
		// Two members wait for most of the first job's run: this is what
		// the queue is for, and what shows the measurement works.
		t.Errorf("plain Nomad held %.1f GPU-seconds idle; want the two early members' wait (≥ 2)", plainIdle)
	}
	c.purge("e2e-plain-a")
	c.purge("e2e-plain-b")

	// Queue mode: the configuration, and the controller queue apply starts.
	c.applyQueues(t, cc, fmt.Sprintf("queue \"default\" {\n  gpus = %d\n}\n", gpus))

	out := submit("e2e-qgang-a", 2, runSecs)
	if !strings.Contains(out, "queued e2e-qgang-a in default") {
		t.Errorf("submit in queue mode says:\n%s\nwant that it queued the job", out)
	}
	c.waitHolding(t, "e2e-qgang-a", 2, 2*time.Minute)
	start = time.Now()
	submit("e2e-qgang-b", 4, 3)

	// While A runs, B waits in its queue: status and list say where and
	// why, and Nomad has no job of it.
	queueWait(t, time.Minute, "B queued with a position and a reason", func() (bool, string) {
		st := queueStatus(t, cc, "e2e-qgang-b")
		return st != nil && st.State == admit.StateQueued && st.Position == 1 && st.Reason != "", fmt.Sprintf("%+v", st)
	})
	if q := c.jobQueueStatus(t, "e2e-qgang-b"); q.State != admit.StateQueued || q.Position != 1 || q.GPUs != 4 || !strings.Contains(q.Reason, "GPUs") {
		t.Errorf("status of B while A runs: %+v; want queued at position 1 for 4 GPUs, with a reason about GPUs", *q)
	}
	lout, lerr, code := c.gpujobEnv(t, env, time.Minute, "list")
	if code != 0 || !strings.Contains(lout, "e2e-qgang-b") || !strings.Contains(lout, "queued") {
		t.Errorf("gpujob list exited %d and does not show B queued:\n%s%s", code, lout, lerr)
	}
	if _, _, err := c.nomad.Jobs().Info("e2e-qgang-b", nil); err == nil {
		t.Errorf("B has a Nomad job while it waits in its queue")
	}
	if held := c.holding(t, "e2e-qgang-a"); len(held) != 2 {
		t.Fatalf("A holds %d allocations while B waits, want 2 (it must still run for this check to mean anything)", len(held))
	}

	// C, queued behind B (as large, so no backfill beside A), is withdrawn
	// by gpujob stop: nothing of it runs.
	submit("e2e-qgang-c", 4, 3)
	queueWait(t, time.Minute, "C queued", func() (bool, string) {
		st := queueStatus(t, cc, "e2e-qgang-c")
		return st != nil && st.State == admit.StateQueued, fmt.Sprintf("%+v", st)
	})
	stopOut, stopErr, code := c.gpujobEnv(t, env, time.Minute, "stop", "e2e-qgang-c")
	if code != 0 || !strings.Contains(stopOut+stopErr, "withdrawn from queue default") {
		t.Errorf("gpujob stop of a queued job exited %d:\n%s%s", code, stopOut, stopErr)
	}
	if kv, _, err := cc.KV().Get(admit.JobKey(contract.QueueJobsPrefix, "default", "e2e-qgang-c"), nil); err != nil || kv != nil {
		t.Errorf("C's record after its stop: %v (%v)", kv != nil, err)
	}

	queuedIdle, queuedWhole := c.partialGang(t, "e2e-qgang-b", 4, 1, 3*time.Minute)
	t.Logf("queue mode: the 4-worker job held %.1f GPU-seconds idle while partly placed; whole %s after its submit",
		queuedIdle, queuedWhole.Sub(start).Round(100*time.Millisecond))
	if queuedIdle != 0 {
		t.Errorf("in queue mode the 4-worker job held %.1f GPU-seconds idle while partly placed, want 0", queuedIdle)
	}
	if held := c.holding(t, "e2e-qgang-a"); len(held) != 0 {
		t.Errorf("B was admitted while A held %d allocations", len(held))
	}
	c.checkAdmittedWhole(t, cc, "e2e-qgang-b", 4)
	nodes := map[string]bool{}
	for _, a := range c.holding(t, "e2e-qgang-b") {
		nodes[a.NodeID] = true
	}
	if len(nodes) != 2 {
		t.Errorf("B's 4 members are on %d nodes, want both clients", len(nodes))
	}
	if _, _, err := c.nomad.Jobs().Info("e2e-qgang-c", nil); err == nil {
		t.Errorf("C, withdrawn while queued, has a Nomad job")
	}
	queueWait(t, 2*time.Minute, "B finished and forgotten", func() (bool, string) {
		kv, _, err := cc.KV().Get(admit.JobKey(contract.QueueJobsPrefix, "default", "e2e-qgang-b"), &consul.QueryOptions{})
		return err == nil && kv == nil, fmt.Sprintf("record there: %v (%v)", kv != nil, err)
	})
}
