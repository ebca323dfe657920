package e2e

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
)

// gpuJob is a one-task raw_exec batch job that asks for gpus fake GPUs and
// runs script under /bin/sh.
func gpuJob(id string, gpus int, script string) *api.Job {
	job := api.NewBatchJob(id, id, "global", 50)
	job.Datacenters = []string{"*"}
	task := api.NewTask("t", "raw_exec").
		SetConfig("command", "/bin/sh").
		SetConfig("args", []string{"-c", script}).
		Require(&api.Resources{
			CPU:      intp(100),
			MemoryMB: intp(64),
			Devices:  []*api.RequestedDevice{{Name: "nvidia/gpu", Count: uint64p(uint64(gpus))}},
		})
	group := api.NewTaskGroup("g", 1).AddTask(task)
	group.RestartPolicy = &api.RestartPolicy{Attempts: intp(0), Mode: strp("fail")}
	group.ReschedulePolicy = &api.ReschedulePolicy{Attempts: intp(0), Unlimited: boolp(false)}
	return job.AddTaskGroup(group)
}

// register submits job and purges it when the test ends.
func (c *cluster) register(t *testing.T, job *api.Job) *api.JobRegisterResponse {
	t.Helper()
	resp, _, err := c.nomad.Jobs().Register(job, nil)
	if err != nil {
		t.Fatalf("registering %s: %v", *job.ID, err)
	}
	t.Cleanup(func() { c.purge(*job.ID) })
	return resp
}

// purge stops a job and waits until none of its allocations runs, so the
// next test starts with every GPU free.
func (c *cluster) purge(id string) {
	if _, _, err := c.nomad.Jobs().Deregister(id, true, nil); err != nil {
		return
	}
	deadline := time.Now().Add(30 * time.Second)
	var index uint64
	for time.Now().Before(deadline) {
		allocs, meta, err := c.nomad.Jobs().Allocations(id, true, &api.QueryOptions{WaitIndex: index, WaitTime: 5 * time.Second})
		if err != nil {
			return
		}
		index = meta.LastIndex
		running := 0
		for _, a := range allocs {
			if a.ClientStatus == api.AllocClientStatusRunning || a.ClientStatus == api.AllocClientStatusPending {
				running++
			}
		}
		if running == 0 {
			return
		}
	}
}

// waitAllocs blocks (Nomad blocking queries, no polling interval) until
// done accepts the job's allocations, or fails the test at the deadline.
func (c *cluster) waitAllocs(t *testing.T, ctx context.Context, jobID string, what string,
	done func([]*api.AllocationListStub) bool) []*api.AllocationListStub {
	t.Helper()
	var index uint64
	var last []*api.AllocationListStub
	for {
		q := (&api.QueryOptions{WaitIndex: index, WaitTime: 5 * time.Second}).WithContext(ctx)
		allocs, meta, err := c.nomad.Jobs().Allocations(jobID, false, q)
		if ctx.Err() != nil {
			t.Fatalf("job %s: timed out waiting for %s; allocations: %s\n%s", jobID, what, describeAllocs(last), c.explainJob(t, jobID))
		}
		if err != nil {
			t.Fatalf("job %s: listing allocations: %v", jobID, err)
		}
		index, last = meta.LastIndex, allocs
		if done(allocs) {
			return allocs
		}
	}
}

// explainJob is what `gpujob status` says of a job (with the cluster's
// management token and TLS material): for a training job that did not get
// going, why each member waits, and why the unplaced ones are not placed.
func (c *cluster) explainJob(t *testing.T, jobID string) string {
	t.Helper()
	env := append(os.Environ(), "NOMAD_ADDR="+c.env["NOMAD_ADDR"], "CONSUL_HTTP_ADDR="+c.env["CONSUL_HTTP_ADDR"])
	for _, k := range []string{"NOMAD_CACERT", "NOMAD_CLIENT_CERT", "NOMAD_CLIENT_KEY"} {
		if v := c.env[k]; v != "" {
			env = append(env, k+"="+v)
		}
	}
	if token := c.secret("nomad-management"); token != "" {
		env = append(env, "NOMAD_TOKEN="+token)
	}
	out, errOut, code := c.gpujobEnv(t, env, 30*time.Second, "status", jobID)
	return fmt.Sprintf("gpujob status %s (exit %d):\n%s%s", jobID, code, out, errOut)
}

func describeAllocs(allocs []*api.AllocationListStub) string {
	if len(allocs) == 0 {
		return "none"
	}
	var parts []string
	for _, a := range allocs {
		parts = append(parts, fmt.Sprintf("%s=%s", a.ID[:8], a.ClientStatus))
	}
	return strings.Join(parts, ", ")
}

// allIn reports whether every allocation has one of the statuses.
func allIn(statuses ...string) func([]*api.AllocationListStub) bool {
	return func(allocs []*api.AllocationListStub) bool {
		if len(allocs) == 0 {
			return false
		}
		for _, a := range allocs {
			ok := false
			for _, s := range statuses {
				ok = ok || a.ClientStatus == s
			}
			if !ok {
				return false
			}
		}
		return true
	}
}

// anyIn reports whether some allocation has one of the statuses.
func anyIn(statuses ...string) func([]*api.AllocationListStub) bool {
	return func(allocs []*api.AllocationListStub) bool {
		for _, a := range allocs {
			for _, s := range statuses {
				if a.ClientStatus == s {
					return true
				}
			}
		}
		return false
	}
}

// failureReport is what a test prints when a member failed where it should
// not have: every member's train task events and the tail of the failed
// members' stderr (the supervisor's own log lines are there).
func (c *cluster) failureReport(t *testing.T, allocs []*api.AllocationListStub) string {
	t.Helper()
	var b strings.Builder
	b.WriteString(c.taskEvents(t, allocs))
	for _, a := range allocs {
		if a.ClientStatus != api.AllocClientStatusFailed {
			continue
		}
		alloc, _, err := c.nomad.Allocations().Info(a.ID, nil)
		if err != nil {
			fmt.Fprintf(&b, "\n%s: %v", a.Name, err)
			continue
		}
		r, err := c.nomad.AllocFS().Cat(alloc, "alloc/logs/train.stderr.0", nil)
		if err != nil {
			fmt.Fprintf(&b, "\n%s stderr: %v", a.Name, err)
			continue
		}
		out, _ := io.ReadAll(r)
		r.Close()
		lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
		if len(lines) > 40 {
			lines = lines[len(lines)-40:]
		}
		fmt.Fprintf(&b, "\n%s stderr (last %d lines):\n  %s", a.Name, len(lines), strings.Join(lines, "\n  "))
	}
	return b.String()
}

// stdout reads task t's stdout of an allocation through the Nomad API.
func (c *cluster) stdout(t *testing.T, allocID string) string {
	t.Helper()
	return c.taskLog(t, allocID, "t", "stdout")
}

// taskLog reads a task's log (stream "stdout" or "stderr") through the
// Nomad API.
func (c *cluster) taskLog(t *testing.T, allocID, task, stream string) string {
	t.Helper()
	alloc, _, err := c.nomad.Allocations().Info(allocID, nil)
	if err != nil {
		t.Fatalf("allocation %s: %v", allocID, err)
	}
	r, err := c.nomad.AllocFS().Cat(alloc, fmt.Sprintf("alloc/logs/%s.%s.0", task, stream), nil)
	if err != nil {
		t.Fatalf("reading the %s of allocation %s: %v", stream, allocID, err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("reading the %s of allocation %s: %v", stream, allocID, err)
	}
	return string(b)
}

// waitStdout follows task t's stdout (a streaming log request, so the test
// wakes on the line itself) until it contains want.
func (c *cluster) waitStdout(t *testing.T, ctx context.Context, allocID, want string) string {
	t.Helper()
	alloc, _, err := c.nomad.Allocations().Info(allocID, nil)
	if err != nil {
		t.Fatalf("allocation %s: %v", allocID, err)
	}
	cancel := make(chan struct{})
	defer close(cancel)
	frames, errs := c.nomad.AllocFS().Logs(alloc, true, "t", "stdout", api.OriginStart, 0, cancel, nil)
	var got strings.Builder
	for {
		select {
		case <-ctx.Done():
			t.Fatalf("allocation %s never printed %q; stdout so far: %q", allocID, want, got.String())
		case err := <-errs:
			t.Fatalf("following the log of allocation %s: %v", allocID, err)
		case f, ok := <-frames:
			if !ok {
				t.Fatalf("log of allocation %s ended without %q: %q", allocID, want, got.String())
			}
			if f != nil {
				got.Write(f.Data)
			}
			if strings.Contains(got.String(), want) {
				return got.String()
			}
		}
	}
}

func intp(i int) *int          { return &i }
func uint64p(i uint64) *uint64 { return &i }
func strp(s string) *string    { return &s }
func boolp(b bool) *bool       { return &b }
