package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/queue/admit"
	"github.com/gpujob/gpujob/internal/queue/nomadseam"
)

// queueTrainSpec is a train spec in the queue "default" whose members
// sleep for secs: what a gang holds, without torch's start-up.
func queueTrainSpec(name string, workers, secs int) string {
	return queueTrainSpecIn("default", name, workers, secs)
}

// queueTrainSpecIn is queueTrainSpec in queue q.
func queueTrainSpecIn(q, name string, workers, secs int) string {
	return fmt.Sprintf(`train %q {
  queue           = %q
  workers         = %d
  gpus_per_worker = 1
  command         = "/bin/sleep"
  args            = ["%d"]
  resources {
    cpu    = 200
    memory = 128
  }
  max_failures       = 0
  rendezvous_timeout = "2m"
}
`, name, q, workers, secs)
}

// queueRecord renders spec as submit does (gpujob render, then Nomad's own
// parser) and makes the job record submit writes for it: its numbers are
// the job's, as the controller checks.
func (c *cluster) queueRecord(t *testing.T, spec string) *admit.JobRecord {
	t.Helper()
	p := filepath.Join(t.TempDir(), "spec.hcl")
	if err := os.WriteFile(p, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	hcl, errOut, code := c.gpujob(t, time.Minute, "render", p)
	if code != 0 {
		t.Fatalf("gpujob render exited %d: %s", code, errOut)
	}
	job, err := c.nomad.Jobs().ParseHCLOpts(&api.JobsParseRequest{JobHCL: hcl, Canonicalize: true})
	if err != nil {
		t.Fatalf("parsing the rendered job: %v\n%s", err, hcl)
	}
	raw, err := json.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	rec := &admit.JobRecord{Format: 1, ID: *job.ID, Namespace: *job.Namespace, Queue: "default", Kind: admit.KindTrain,
		SubmittedAt: time.Now().UTC(), SubmittedBy: "e2e@" + t.Name(), Job: raw}
	for _, g := range job.TaskGroups {
		rec.Members += *g.Count
		var per admit.Resources
		for _, task := range g.Tasks {
			per.CPUMHz += *task.Resources.CPU
			per.MemoryMB += *task.Resources.MemoryMB
			for _, d := range task.Resources.Devices {
				per.GPUs += int(*d.Count)
			}
		}
		rec.PerMember = per
	}
	return rec
}

// putRecord writes the record where submit does, new (check-and-set 0).
func putRecord(t *testing.T, cc *consul.Client, rec *admit.JobRecord) {
	t.Helper()
	b, err := admit.EncodeJobRecord(rec, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ok, _, err := cc.KV().CAS(&consul.KVPair{Key: admit.JobKey(contract.QueueJobsPrefix, rec.Namespace, rec.ID), Value: b}, nil)
	if err != nil || !ok {
		t.Fatalf("writing the job record of %s: %v (written: %v)", rec.ID, err, ok)
	}
}

// queueStatus is the controller's status of job default/id, nil while
// there is none.
func queueStatus(t *testing.T, cc *consul.Client, id string) *admit.Status {
	t.Helper()
	kv, _, err := cc.KV().Get(contract.QueueStatusPrefix+"/default/"+id, &consul.QueryOptions{RequireConsistent: true})
	if err != nil {
		t.Fatalf("reading the status of %s: %v", id, err)
	}
	if kv == nil {
		return nil
	}
	st, err := admit.DecodeStatus(kv.Value)
	if err != nil {
		t.Fatalf("the status of %s: %v\n%s", id, err, kv.Value)
	}
	return st
}

// queueWait polls cond until it says yes or limit passes; what it last
// said is in the failure.
func queueWait(t *testing.T, limit time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %s; last: %s", what, limit, last)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// holding are job id's allocations that hold resources now.
func (c *cluster) holding(t *testing.T, id string) []*api.AllocationListStub {
	t.Helper()
	as, err := c.allocsOf(id)
	if err != nil {
		t.Fatalf("allocations of %s: %v", id, err)
	}
	var out []*api.AllocationListStub
	for _, a := range as {
		if a.ClientStatus == api.AllocClientStatusPending || a.ClientStatus == api.AllocClientStatusRunning {
			out = append(out, a)
		}
	}
	return out
}

// checkAdmittedWhole checks that job id was registered by the admission
// its status names, and that every member was placed at once: members
// allocations of the job's version that admission registered, all made by
// one evaluation that placed the whole group.
func (c *cluster) checkAdmittedWhole(t *testing.T, cc *consul.Client, id string, members int) {
	t.Helper()
	kv, _, err := cc.KV().Get(admit.JobKey(contract.QueueJobsPrefix, "default", id), nil)
	if err != nil || kv == nil {
		t.Fatalf("the record of %s: %v", id, err)
	}
	job, _, err := c.nomad.Jobs().Info(id, nil)
	if err != nil {
		t.Fatalf("job %s is not registered: %v", id, err)
	}
	if want := admit.Marker(kv.CreateIndex, queueStatus(t, cc, id).Admissions); job.Meta[contract.MetaAdmission] != want {
		t.Errorf("job %s: meta %s = %q, want %q", id, contract.MetaAdmission, job.Meta[contract.MetaAdmission], want)
	}
	// The allocations of this admission: of the job's version its marker
	// registered (a job admitted again after a preemption has the
	// stopped members of its earlier admissions too).
	var allocs []*api.AllocationListStub
	queueWait(t, time.Minute, fmt.Sprintf("%d allocations of %s", members, id), func() (bool, string) {
		var all []*api.AllocationListStub
		all, err = c.allocsOf(id)
		allocs = allocs[:0]
		for _, a := range all {
			if a.JobVersion == *job.Version {
				allocs = append(allocs, a)
			}
		}
		return err == nil && len(allocs) >= members, fmt.Sprintf("%d allocations of version %d (%v)", len(allocs), *job.Version, err)
	})
	if len(allocs) != members {
		t.Fatalf("job %s has %d allocations of version %d, want %d", id, len(allocs), *job.Version, members)
	}
	evals := map[string]bool{}
	for _, a := range allocs {
		evals[a.EvalID] = true
		if a.ClientStatus == api.AllocClientStatusFailed || a.ClientStatus == api.AllocClientStatusLost {
			t.Errorf("allocation %s of %s: %s", a.Name, id, a.ClientStatus)
		}
	}
	if len(evals) != 1 {
		t.Fatalf("job %s's members were placed by %d evaluations, want one: %v", id, len(evals), evals)
	}
	for e := range evals {
		ev, _, err := c.nomad.Evaluations().Info(e, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(ev.FailedTGAllocs) > 0 || ev.BlockedEval != "" {
			t.Errorf("job %s's evaluation left members unplaced: failed %v, blocked %q", id, ev.FailedTGAllocs, ev.BlockedEval)
		}
	}
}

// The admission controller as a Nomad job, on real agents: queue apply
// starts it; a queued gang that fits is admitted whole (registered with its
// admission marker, every member placed by one evaluation); a second that
// does not fit beside it waits with a reason in plain words and no Nomad
// job, and is admitted once the first has ended; the finished gang's
// record and status are forgotten.
func TestQueueController(t *testing.T) {
	c := needCluster(t)
	c.nodeGPUs(t, fakeGPUsPerClient)
	cc := c.consulClient(t)
	t.Cleanup(func() { c.resetQueues(t, cc, "e2e-queue-a", "e2e-queue-b") })

	// The controller's Nomad on the real agents: the idle cluster's one
	// node with its GPUs, a watch that answers Nomad's index, a missing
	// job read as none and stopped as success.
	seam := nomadseam.New(c.nomad)
	bg := ctx(t, time.Minute)
	nodes, err := seam.Nodes(bg)
	if err != nil || len(nodes) != 1 || nodes[0].Capacity.GPUs != fakeGPUsPerClient || nodes[0].Capacity.CPUMHz <= 0 ||
		nodes[0].Capacity.CPUMHz > clientCPUMHz {
		t.Fatalf("Nodes() = %+v, %v; want the one client with its %d GPUs and at most %d MHz", nodes, err, fakeGPUsPerClient, clientCPUMHz)
	}
	if idx, err := seam.WaitAllocations(bg, 0); err != nil || idx == 0 {
		t.Fatalf("WaitAllocations(0) = %d, %v", idx, err)
	}
	if info, err := seam.Job(bg, "default", "e2e-queue-none"); info != nil || err != nil {
		t.Fatalf("Job of a missing job = %+v, %v", info, err)
	}
	if err := seam.Stop(bg, "default", "e2e-queue-none"); err != nil {
		t.Fatalf("Stop of a missing job: %v", err)
	}

	queues := filepath.Join(t.TempDir(), "queues.hcl")
	if err := os.WriteFile(queues, []byte(fmt.Sprintf("queue \"default\" {\n  gpus = %d\n}\n", fakeGPUsPerClient)), 0o644); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "NOMAD_ADDR="+c.env["NOMAD_ADDR"], "CONSUL_HTTP_ADDR="+c.env["CONSUL_HTTP_ADDR"],
		"GPUJOB_CONTROLLER_BINARY="+c.env["GPUJOB_CONTROLLER_BINARY"])
	out, errOut, code := c.gpujobEnv(t, env, time.Minute, "queue", "apply", queues)
	if code != 0 || !strings.Contains(out, "queue controller: registered job "+render.QueueControllerJob) {
		t.Fatalf("queue apply exited %d:\n%s%s", code, out, errOut)
	}
	// A second apply finds it and leaves it alone.
	out, errOut, code = c.gpujobEnv(t, env, time.Minute, "queue", "apply", queues)
	if code != 0 || !strings.Contains(out, "queue controller: job "+render.QueueControllerJob+" runs") {
		t.Fatalf("queue apply again exited %d:\n%s%s", code, out, errOut)
	}

	// The controller leads, under its allocation's ID.
	queueWait(t, 2*time.Minute, "controller leading", func() (bool, string) {
		kv, _, err := cc.KV().Get(contract.QueueLeaderKey, nil)
		if err != nil || kv == nil || kv.Session == "" {
			return false, fmt.Sprintf("leader key %+v (%v)", kv, err)
		}
		for _, a := range c.holding(t, render.QueueControllerJob) {
			if a.ID == string(kv.Value) {
				return true, ""
			}
		}
		return false, fmt.Sprintf("leader %q is no allocation of %s", kv.Value, render.QueueControllerJob)
	})

	// Gang A (3 of the 4 GPUs) fits: admitted whole.
	a := c.queueRecord(t, queueTrainSpec("e2e-queue-a", 3, 30))
	if a.Members != 3 || a.PerMember.GPUs != 1 {
		t.Fatalf("record of A: %d members of %d GPUs", a.Members, a.PerMember.GPUs)
	}
	putRecord(t, cc, a)
	queueWait(t, time.Minute, "admission of A", func() (bool, string) {
		st := queueStatus(t, cc, a.ID)
		return st != nil && st.State == admit.StateAdmitted, fmt.Sprintf("%+v", st)
	})
	c.checkAdmittedWhole(t, cc, a.ID, 3)
	// Registering A again as new fails Nomad's index check: the conflict
	// the controller relies on against a deposed leader.
	jobA, _, err := c.nomad.Jobs().Info(a.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := seam.Register(bg, jobA, 0); !errors.Is(err, admit.ErrConflict) {
		t.Errorf("registering A again with index 0: %v, want admit.ErrConflict", err)
	}
	allocs, err := seam.Allocations(bg)
	if err != nil {
		t.Fatal(err)
	}
	gpusOfA := 0
	for _, al := range allocs {
		if al.JobID == a.ID {
			gpusOfA += al.Resources.GPUs
			if al.JobMeta[contract.MetaAdmission] == "" {
				t.Errorf("allocation %s of A carries no admission marker in its job meta: %v", al.ID, al.JobMeta)
			}
		}
	}
	if gpusOfA != 3 {
		t.Errorf("A's allocations hold %d GPUs by Allocations(), want 3", gpusOfA)
	}

	// Gang B (2 GPUs) does not fit beside A: it waits, says why, and Nomad
	// has no job of it.
	b := c.queueRecord(t, queueTrainSpec("e2e-queue-b", 2, 3))
	putRecord(t, cc, b)
	var waiting *admit.Status
	queueWait(t, time.Minute, "B waiting with a reason", func() (bool, string) {
		waiting = queueStatus(t, cc, b.ID)
		return waiting != nil && waiting.State == admit.StateQueued && waiting.Reason != "", fmt.Sprintf("%+v", waiting)
	})
	if !strings.Contains(waiting.Reason, "GPUs") || waiting.Position != 1 {
		t.Errorf("B waits at position %d because %q; want position 1 and a reason about GPUs", waiting.Position, waiting.Reason)
	}
	if held := c.holding(t, a.ID); len(held) != 3 {
		t.Fatalf("A holds %d allocations while B waits, want 3 (it must still run for this check to mean anything)", len(held))
	}
	if _, _, err := c.nomad.Jobs().Info(b.ID, nil); err == nil {
		t.Errorf("B has a Nomad job while it waits")
	}
	t.Logf("B waits: %s", waiting.Reason)

	// A ends; B is admitted whole; A is forgotten.
	queueWait(t, 2*time.Minute, "admission of B after A ended", func() (bool, string) {
		st := queueStatus(t, cc, b.ID)
		return st != nil && st.State == admit.StateAdmitted, fmt.Sprintf("%+v; A holds %d", st, len(c.holding(t, a.ID)))
	})
	if held := c.holding(t, a.ID); len(held) != 0 {
		t.Errorf("B was admitted while A held %d allocations", len(held))
	}
	c.checkAdmittedWhole(t, cc, b.ID, 2)
	queueWait(t, 2*time.Minute, "A's record and status forgotten", func() (bool, string) {
		rec, _, err1 := cc.KV().Get(admit.JobKey(contract.QueueJobsPrefix, "default", a.ID), nil)
		st, _, err2 := cc.KV().Get(contract.QueueStatusPrefix+"/default/"+a.ID, nil)
		return err1 == nil && err2 == nil && rec == nil && st == nil, fmt.Sprintf("record %v, status %v", rec != nil, st != nil)
	})

	// Stopped, the controller resigns: the leader key is free well before
	// its session's TTL (10 s) could have expired.
	if _, _, err := c.nomad.Jobs().Deregister(render.QueueControllerJob, false, nil); err != nil {
		t.Fatal(err)
	}
	queueWait(t, 8*time.Second, "leader key released on SIGTERM", func() (bool, string) {
		kv, _, err := cc.KV().Get(contract.QueueLeaderKey, nil)
		return err == nil && (kv == nil || kv.Session == ""), fmt.Sprintf("%+v (%v)", kv, err)
	})
}

// resetQueues leaves the cluster as the queue tests found it: the
// controller's job and jobs gone, no queue configuration (other tests
// submit straight to Nomad when there is none), nothing under the queues'
// tree.
func (c *cluster) resetQueues(t *testing.T, cc *consul.Client, jobs ...string) {
	t.Helper()
	c.purge(render.QueueControllerJob)
	for _, j := range jobs {
		c.purge(j)
	}
	for _, p := range []string{contract.QueueJobsPrefix + "/", contract.QueueStatePrefix + "/"} {
		if _, err := cc.KV().DeleteTree(p, nil); err != nil {
			t.Errorf("deleting %s: %v", p, err)
		}
	}
	if _, err := cc.KV().Delete(contract.QueueConfigKey, nil); err != nil {
		t.Errorf("deleting %s: %v", contract.QueueConfigKey, err)
	}
	if left, _, err := cc.KV().Keys(contract.QueuePrefix+"/", "", nil); err != nil || len(left) > 0 {
		t.Errorf("left under %s/: %v (%v)", contract.QueuePrefix, left, err)
	}
	for _, j := range append([]string{render.QueueControllerJob}, jobs...) {
		if held := c.holding(t, j); len(held) > 0 {
			t.Errorf("job %s still holds %d allocations", j, len(held))
		}
	}
}
