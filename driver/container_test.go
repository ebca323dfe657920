package driver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/plugins/drivers"
	dtestutil "github.com/hashicorp/nomad/plugins/drivers/testutils"

	"github.com/gpujob/gpujob/driver/supervisor"
	"github.com/gpujob/gpujob/internal/containermember"
	"github.com/gpujob/gpujob/internal/taskevent"
)

// containerHarness is a driver whose container members keep their run
// directories under the test's own directory, with this test binary as the
// static supervisor it copies.
func containerHarness(t *testing.T, root string) (*dtestutil.DriverHarness, string, string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	runRoot := t.TempDir()
	h := harnessWith(t, Config{CheckpointRoot: root, ContainerSupervisor: self}, func(d *Driver) { d.runRoot = runRoot })
	return h, runRoot, self
}

// TestContainerMemberPreparesTheContainerAndRelaysItsEvents runs two
// container members as the docker driver would, without Docker: each
// sidecar prepares its member's run directory, then the supervisor runs from
// the spec it wrote (the test binary stands in for the static one, and the
// events file is the host side of the container's /alloc). The group must
// train through the rendezvous, and the supervisors' events must reach Nomad
// as events of the docker task, not of the sidecar.
func TestContainerMemberPreparesTheContainerAndRelaysItsEvents(t *testing.T) {
	root := t.TempDir()
	h, runRoot, self := containerHarness(t, root)
	p := ports(t, 2)
	tc := TaskConfig{Command: "/bin/sh", NProcPerNode: 1, MaxRestarts: 1,
		Args:          []string{"-c", `echo "rank=$RANK world=$WORLD_SIZE ckpt=$GPUJOB_CHECKPOINT_DIR"`},
		Rendezvous:    &RendezvousConfig{NNodes: "2", Port: "rdzv", JoinTimeout: "30s"},
		ContainerTask: "train", CheckpointRoot: root}
	cfgs := []*drivers.TaskConfig{
		memberTask(t, h, "ctr", 0, p[0], "gpujob", tc),
		memberTask(t, h, "ctr", 1, p[1], "gpujob", tc),
	}
	events, err := h.TaskEvents(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	var supers []*exec.Cmd
	for i, cfg := range cfgs {
		if _, _, err := h.StartTask(cfg); err != nil {
			t.Fatalf("starting sidecar %d: %v", i, err)
		}
		t.Cleanup(func() { _ = h.DestroyTask(cfg.ID, true) })
		dir := filepath.Join(runRoot, cfg.AllocID)
		if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
			t.Fatalf("run dir %s: %v, mode %v; want 0700", dir, err, fi.Mode())
		}
		specPath := filepath.Join(dir, containermember.SpecName)
		if fi, err := os.Stat(specPath); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("spec %s: %v; want mode 0600 (it holds the Consul token)", specPath, err)
		}
		got, err := os.ReadFile(filepath.Join(dir, containermember.SupervisorName))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("the run dir's supervisor is not a copy of container_supervisor (%v)", err)
		}
		spec, err := supervisor.ReadSpec(specPath)
		if err != nil {
			t.Fatal(err)
		}
		if !spec.Container || spec.EventsFile != "/alloc/gpujob/train.events" || spec.GroupsFile != "" ||
			spec.StopDeadlineFile != "" || spec.VisibleDevices != nil || spec.GPUIsolation != nil {
			t.Errorf("spec is not a container member's: %+v", spec)
		}
		if want := filepath.Join(root, "default", "ctr"); spec.CheckpointDir != want {
			t.Errorf("checkpoint dir %q, want %q", spec.CheckpointDir, want)
		}
		if fi, err := os.Stat(spec.CheckpointDir); err != nil || !fi.IsDir() {
			t.Errorf("the sidecar did not make the checkpoint directory the container mounts: %v", err)
		}
		// The container's view of /alloc is the allocation's shared dir.
		spec.EventsFile = filepath.Join(cfg.AllocDir, "alloc", "gpujob", "train.events")
		local := filepath.Join(t.TempDir(), "spec.json")
		if err := supervisor.WriteSpec(local, spec); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(self, SuperviseCommand, local)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		supers = append(supers, cmd)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("supervisor %d:\n%s", i, out.String())
			}
		})
	}
	for i, cmd := range supers {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("supervisor %d: %v", i, err)
		}
	}
	// Once a supervisor has read its spec (its events file appears), the
	// sidecar removes it: the Consul token does not stay where root in the
	// container (whoever may alloc exec) can read it.
	for _, cfg := range cfgs {
		dir := filepath.Join(runRoot, cfg.AllocID)
		if err := waitGoneFile(filepath.Join(dir, containermember.SpecName), 5*time.Second); err != nil {
			t.Error(err)
		}
		if _, err := os.Stat(filepath.Join(dir, containermember.SupervisorName)); err != nil {
			t.Errorf("the supervisor binary went with the spec: %v", err)
		}
	}

	// Both members joined and succeeded, told as the docker task's events.
	seen := map[string]map[taskevent.Kind]bool{}
	timeout := time.After(10 * time.Second)
	for len(seen) < 2 || !seen[cfgs[0].AllocID][taskevent.Succeeded] || !seen[cfgs[1].AllocID][taskevent.Succeeded] {
		select {
		case e := <-events:
			te, ok := taskevent.Decode(e.Annotations)
			if !ok {
				t.Fatalf("event %q carries no structured details", e.Message)
			}
			if e.TaskName != "train" {
				t.Fatalf("event %q is filed under task %q, want the docker task %q", e.Message, e.TaskName, "train")
			}
			if seen[e.AllocID] == nil {
				seen[e.AllocID] = map[taskevent.Kind]bool{}
			}
			seen[e.AllocID][te.Kind] = true
		case <-timeout:
			t.Fatalf("events seen: %v; want joined and succeeded from both members", seen)
		}
	}
	for _, cfg := range cfgs {
		if !seen[cfg.AllocID][taskevent.Joined] {
			t.Errorf("no joined event for %s: %v", cfg.AllocID, seen[cfg.AllocID])
		}
	}

	// Nomad stops the sidecars once the main task is over: they exit 0,
	// and destroying one removes what the container mounted.
	for _, cfg := range cfgs {
		wait, err := h.WaitTask(context.Background(), cfg.ID)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.StopTask(cfg.ID, 5*time.Second, "SIGTERM"); err != nil {
			t.Fatal(err)
		}
		if r := <-wait; r == nil || !r.Successful() {
			t.Errorf("sidecar exited %+v, want success", r)
		}
		if err := h.DestroyTask(cfg.ID, false); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(runRoot, cfg.AllocID)); !os.IsNotExist(err) {
			t.Errorf("run dir of %s left after destroy: %v", cfg.AllocID, err)
		}
	}
	consulEmpty(t, "default/ctr")
}

// TestContainerMemberRefusesWhatCannotWork: each mistake fails the sidecar
// at its start, saying what to change, and leaves no run directory.
func TestContainerMemberRefusesWhatCannotWork(t *testing.T) {
	root := t.TempDir()
	base := TaskConfig{Command: "/bin/true", Rendezvous: &RendezvousConfig{NNodes: "1"}, ContainerTask: "train"}
	for _, c := range []struct {
		name string
		task string
		job  string
		edit func(*TaskConfig, *Config)
		want string
	}{
		{"container task is the sidecar", "train", "bad", nil, `container_task: "train" is this task`},
		{"another checkpoint root", "gpujob", "bad", func(tc *TaskConfig, _ *Config) { tc.CheckpointRoot = "/elsewhere" },
			"GPUJOB_CHECKPOINT_ROOT=" + root},
		{"job ID that is no path segment", "gpujob", "a:b", nil, "safe path segments"},
		{"no static supervisor", "gpujob", "bad", func(_ *TaskConfig, pc *Config) { pc.ContainerSupervisor = "/nonexistent/gpujob-supervisor" },
			"container_supervisor"},
		{"kill timeout that is no duration", "gpujob", "bad", func(tc *TaskConfig, _ *Config) { tc.ContainerKillTimeout = "soon" },
			`container_kill_timeout: "soon" is not a positive duration`},
		// Docker counts whole seconds: 900ms would be no grace at all.
		{"kill timeout under a second", "gpujob", "bad", func(tc *TaskConfig, _ *Config) { tc.ContainerKillTimeout = "900ms" },
			"container_kill_timeout: 900ms is not between 1s and 10m0s"},
		{"kill timeout past checkpoint_grace's bound", "gpujob", "bad", func(tc *TaskConfig, _ *Config) { tc.ContainerKillTimeout = "11m" },
			"container_kill_timeout: 11m0s is not between 1s and 10m0s"},
	} {
		t.Run(c.name, func(t *testing.T) {
			self, _ := os.Executable()
			pc := Config{CheckpointRoot: root, ContainerSupervisor: self}
			tc := base
			if c.edit != nil {
				c.edit(&tc, &pc)
			}
			runRoot := t.TempDir()
			h := harnessWith(t, pc, func(d *Driver) { d.runRoot = runRoot })
			cfg := memberTask(t, h, c.job, 0, 0, c.task, tc)
			_, _, err := h.StartTask(cfg)
			if err == nil {
				_ = h.DestroyTask(cfg.ID, true)
				t.Fatal("the sidecar started")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not say %q", err, c.want)
			}
			if left, _ := os.ReadDir(runRoot); len(left) != 0 {
				t.Errorf("run dirs left: %v", left)
			}
		})
	}
}

// TestContainerSpecRoundTrips: the container flag and the kill timeout
// survive the spec file, and a host member's spec carries neither.
func TestContainerSpecRoundTrips(t *testing.T) {
	s := &supervisor.Spec{EventsFile: "/x", GroupsFile: "/g", StopDeadlineFile: "/d"}
	containerSpec(s, "my task", 90*time.Second)
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var back supervisor.Spec
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !back.Container || back.GroupsFile != "" || back.StopDeadlineFile != "" || time.Duration(back.KillTimeout) != 90*time.Second {
		t.Errorf("round trip: %+v", back)
	}
	// A task name that is not a path segment is encoded into one.
	if strings.Count(back.EventsFile, "/") != 3 || !strings.HasPrefix(back.EventsFile, "/alloc/gpujob/") {
		t.Errorf("events file %q is not one file in /alloc/gpujob", back.EventsFile)
	}
	b, _ = json.Marshal(&supervisor.Spec{})
	if strings.Contains(string(b), "container") || strings.Contains(string(b), "kill_timeout") {
		t.Errorf("a host member's spec names the container or a kill timeout: %s", b)
	}
}

func waitGoneFile(path string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if _, err := os.Stat(path); os.IsNotExist(err) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s still there after %s", path, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestContainerSidecarHandle: the sidecar runs no process, and each driver
// call says so or does what fits; a second sidecar in the allocation is
// refused; a driver that recovers the sidecar after a client restart relays
// the container's events again and cleans up as the first would.
func TestContainerSidecarHandle(t *testing.T) {
	root := t.TempDir()
	h, runRoot, self := containerHarness(t, root)
	tc := TaskConfig{Command: "/bin/true", Rendezvous: &RendezvousConfig{NNodes: "1"}, ContainerTask: "train", CheckpointRoot: root}
	cfg := memberTask(t, h, "side", 0, 0, "gpujob", tc)
	handle, _, err := h.StartTask(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.DestroyTask(cfg.ID, true) })

	st, err := h.InspectTask(cfg.ID)
	if err != nil || st.State != drivers.TaskStateRunning || st.DriverAttributes["container_task"] != "train" {
		t.Errorf("inspect: %+v, %v", st, err)
	}
	if err := h.SignalTask(cfg.ID, "SIGHUP"); err != nil {
		t.Errorf("signal (nomad alloc signal reaches every task): %v", err)
	}
	if _, err := h.ExecTask(cfg.ID, []string{"/bin/true"}, time.Second); err == nil || !strings.Contains(err.Error(), `exec into that task`) {
		t.Errorf("exec: %v; want a pointer to the container task", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	stats, err := h.TaskStats(ctx, cfg.ID, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if u := <-stats; u == nil || u.ResourceUsage == nil {
		t.Errorf("no stats from the sidecar: %+v", u)
	}
	cancel()

	second := *cfg
	second.ID, second.Name = cfg.ID+"-2", "gpujob2"
	if _, _, err := h.StartTask(&second); err == nil || !strings.Contains(err.Error(), "already prepares a container member") {
		_ = h.DestroyTask(second.ID, true)
		t.Errorf("a second sidecar in the allocation: %v", err)
	}
	if _, err := os.Stat(filepath.Join(runRoot, cfg.AllocID, containermember.SpecName)); err != nil {
		t.Fatalf("the refused second sidecar touched the first's run dir: %v", err)
	}

	// A client restart: another driver recovers the handle.
	h2 := harnessWith(t, Config{CheckpointRoot: root, ContainerSupervisor: self}, func(d *Driver) { d.runRoot = runRoot })
	if err := h2.RecoverTask(handle); err != nil {
		t.Fatal(err)
	}
	events, err := h2.TaskEvents(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// The event stream is subscribed through gRPC, which may not have
	// reached the driver's eventer yet: events emitted before are not
	// delivered. So the "container" appends an event every 200 ms until
	// one arrives.
	eventsFile := filepath.Join(cfg.AllocDir, "alloc", "gpujob", "train.events")
	f, err := os.OpenFile(eventsFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	for got := false; !got; {
		select {
		case e := <-events:
			te, _ := taskevent.Decode(e.Annotations)
			if e.TaskName != "train" || te.Round != 4 || te.Kind != taskevent.Joined {
				t.Errorf("recovered relay told %q for task %q", e.Message, e.TaskName)
			}
			got = true
		case <-tick.C:
			line, _ := json.Marshal(taskevent.Event{Kind: taskevent.Joined, Round: 4, Time: time.Now().UTC()})
			if _, err := f.Write(append(line, '\n')); err != nil {
				t.Fatal(err)
			}
		case <-deadline:
			t.Fatal("the recovered sidecar relays nothing")
		}
	}
	if err := h2.StopTask(cfg.ID, time.Second, "SIGTERM"); err != nil {
		t.Fatal(err)
	}
	if err := h2.DestroyTask(cfg.ID, false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(runRoot, cfg.AllocID)); !os.IsNotExist(err) {
		t.Errorf("run dir left after the recovered sidecar's destroy: %v", err)
	}
}
