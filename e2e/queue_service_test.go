package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpujob/gpujob/internal/queue/admit"
)

// queueServiceSpec is a service of serve.py (an untrained model on CPU) of
// 2 GPUs a replica, one replica to start and room for a second.
func (c *cluster) queueServiceSpec(t *testing.T, name string) string {
	t.Helper()
	serve := filepath.Join(c.env["GPUJOB_DEV_WORKLOADS"], "serve.py")
	src := fmt.Sprintf(`service %q {
  queue            = "default"
  gpus_per_replica = 2
  command          = "/usr/bin/python3"
  args             = [%q, "--no-checkpoint"]
  version          = "v1"
  env = {
    OMP_NUM_THREADS = "1"
  }
  replicas {
    initial = 1
    min     = 1
    max     = 2
  }
  # The range needs an autoscaler; the test scales by hand, and the slow
  # scale-down keeps a gateway's autoscaler (none runs here) out of it.
  autoscale {
    target_inflight  = 100
    scale_down_delay = "10m"
  }
  health {
    interval      = "1s"
    timeout       = "1s"
    initial_delay = "15s"
  }
  resources {
    cpu    = 300
    memory = 400
  }
}
`, name, serve)
	p := filepath.Join(t.TempDir(), name+".hcl")
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// A service the queue admitted scales up with no GPU free: the admission
// controller preempts the training gang of its queue for the new replica
// (the service class outranks batch), the gang is told who and why, Nomad
// places the replica on the freed GPUs, and the gang waits in its queue.
func TestQueueServiceScaleUpPreemptsTraining(t *testing.T) {
	c := needCluster(t)
	c.nodeGPUs(t, fakeGPUsPerClient)
	cc := c.consulClient(t)
	const svc, train = "e2e-qsvc", "e2e-qsvc-train"
	c.resetQueues(t, cc)
	t.Cleanup(func() {
		c.gpujob(t, time.Minute, "service", "stop", "--purge", svc)
		c.resetQueues(t, cc, svc, train)
	})
	env := c.queueEnv()
	c.applyQueues(t, cc, fmt.Sprintf("queue \"default\" {\n  gpus = %d\n}\n", fakeGPUsPerClient))

	out, errOut, code := c.gpujobEnv(t, env, 2*time.Minute, "service", "deploy", "--detach", c.queueServiceSpec(t, svc))
	if code != 0 || !strings.Contains(out+errOut, "queue") {
		t.Fatalf("service deploy in queue mode exited %d:\n%s%s", code, out, errOut)
	}
	queueWait(t, 2*time.Minute, "the service admitted", func() (bool, string) {
		st := queueStatus(t, cc, svc)
		return st != nil && st.State == admit.StateAdmitted, fmt.Sprintf("%+v", st)
	})
	c.waitHolding(t, svc, 1, 2*time.Minute)

	src := strings.Replace(queueTrainSpec(train, 1, 600), "gpus_per_worker = 1", "gpus_per_worker = 2", 1)
	c.submitDetached(t, train, strings.Replace(src, "max_failures", "checkpoint_grace   = \"2s\"\n  max_failures", 1))
	c.waitHolding(t, train, 1, 2*time.Minute)

	// Nomad refuses a scale while a deployment runs: the first replica
	// healthy first.
	queueWait(t, 3*time.Minute, "the service's deployment successful", func() (bool, string) {
		d, _, err := c.nomad.Jobs().LatestDeployment(svc, nil)
		if err != nil || d == nil {
			return false, fmt.Sprintf("%v", err)
		}
		return d.Status == "successful", d.Status + ": " + d.StatusDescription
	})
	// No GPU is free: the second replica can only come from the gang.
	if out, errOut, code := c.gpujobEnv(t, env, time.Minute, "service", "scale", svc, "2"); code != 0 {
		t.Fatalf("service scale exited %d:\n%s%s", code, out, errOut)
	}
	var st *admit.Status
	queueWait(t, 2*time.Minute, "the training gang preempted for the scale-up", func() (bool, string) {
		st = queueStatus(t, cc, train)
		return st != nil && st.Preemptions == 1, fmt.Sprintf("%+v", st)
	})
	if st.PreemptedBy != "default/"+svc+admit.ScaleUpSuffix || !strings.Contains(st.PreemptedWhy, "service class outranks batch") {
		t.Errorf("the gang was told it was preempted by %q because %q", st.PreemptedBy, st.PreemptedWhy)
	}
	c.waitHolding(t, svc, 2, 2*time.Minute)
	c.waitHolding(t, train, 0, time.Minute)
	queueWait(t, time.Minute, "the gang waiting in its queue", func() (bool, string) {
		st = queueStatus(t, cc, train)
		return st != nil && st.State == admit.StateQueued, fmt.Sprintf("%+v", st)
	})
	t.Logf("the gang waits: %s", st.Reason)
}
