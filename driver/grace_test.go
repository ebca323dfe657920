package driver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/helper/uuid"

	"github.com/gpujob/gpujob/driver/supervisor"
	"github.com/gpujob/gpujob/internal/containermember"
)

// A stopped member's ranks get SIGTERM and most of the task's kill_timeout
// to save a checkpoint, then SIGKILL: for a host member the driver tells the
// supervisor the deadline at StopTask; a container member's supervisor
// reckons it from the stop signal and container_kill_timeout. These tests
// stop a member whose ranks never exit on SIGTERM, with a kill timeout whose
// plan (stopPlan in the supervisor) gives the ranks 5 s, clearly more than
// the fixed 3 s a stop without a deadline gives.
const (
	graceKillTimeout = 8 * time.Second
	// graceAtLeast is what the ranks must have been given at the least:
	// the plan's 5 s, less slack for a loaded machine, yet above 3 s.
	graceAtLeast = 4 * time.Second
)

// graceRank records when SIGTERM came (term.$RANK) and goes on beating
// (beat.$RANK: the time in ns, every 0.1 s) until SIGKILL; pid.$RANK says
// it runs. The beat's sleep dies of the SIGTERM sent to the rank's process
// group, and the loop goes on.
const graceRank = `trap 'date +%s%N > "$OUT/term.$RANK"' TERM; echo $$ > "$OUT/pid.$RANK"; ` +
	`while :; do date +%s%N > "$OUT/beat.$RANK.tmp" && mv -f "$OUT/beat.$RANK.tmp" "$OUT/beat.$RANK"; sleep 0.1; done`

// graceTask is a one-member task of two graceRank ranks writing to out.
func graceTask(out string) TaskConfig {
	return TaskConfig{Command: "/bin/sh", NProcPerNode: 2, Args: []string{"-c", graceRank}, Env: []map[string]string{{"OUT": out}},
		Rendezvous: &RendezvousConfig{NNodes: "1", JoinTimeout: "30s"}}
}

// waitRanksUp waits until n graceRanks have beaten once, and returns their
// PIDs.
func waitRanksUp(t *testing.T, out string, n int, why func() string) []int {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var pids []int
		for r := 0; r < n; r++ {
			pid, err := readInt(filepath.Join(out, fmt.Sprintf("pid.%d", r)))
			if _, berr := os.Stat(filepath.Join(out, fmt.Sprintf("beat.%d", r))); err == nil && berr == nil {
				pids = append(pids, int(pid))
			}
		}
		if len(pids) == n {
			return pids
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ranks did not start:\n%s", why())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkGrace checks that each of n graceRanks got SIGTERM when the stop
// came (at stopAt), was still running graceAtLeast later, and is gone.
func checkGrace(t *testing.T, out string, n int, stopAt time.Time, pids []int) {
	t.Helper()
	for r := 0; r < n; r++ {
		term, err := readInt(filepath.Join(out, fmt.Sprintf("term.%d", r)))
		if err != nil {
			t.Errorf("rank %d never got SIGTERM: %v", r, err)
			continue
		}
		if got := time.Unix(0, term).Sub(stopAt); got < 0 || got > 2*time.Second {
			t.Errorf("rank %d got SIGTERM %s after the stop, want at once", r, got)
		}
		beat, err := readInt(filepath.Join(out, fmt.Sprintf("beat.%d", r)))
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
			continue
		}
		if lived := time.Unix(0, beat).Sub(stopAt); lived < graceAtLeast {
			t.Errorf("rank %d was killed %s after the stop; a kill_timeout of %s gives the ranks 5s (the fixed grace is 3s)",
				r, lived.Round(10*time.Millisecond), graceKillTimeout)
		}
	}
	noneAlive(t, pids, 0)
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// TestHostMemberStopGivesTheRanksTheKillTimeout: StopTask's timeout (the
// task's kill_timeout) reaches the supervisor, which gives the ranks most
// of it, and the stop still ends within it.
func TestHostMemberStopGivesTheRanksTheKillTimeout(t *testing.T) {
	h := harnessWith(t, Config{}, withoutCgroups)
	out := t.TempDir()
	job := "grace-host-" + uuid.Short()
	cfg := member(t, h, job, 0, ports(t, 1)[0], graceTask(out))
	if _, _, err := h.StartTask(cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.DestroyTask(cfg.ID, true) })
	pids := waitRanksUp(t, out, 2, func() string { return stderr(t, cfg) })
	stopAt := time.Now()
	if err := h.StopTask(cfg.ID, graceKillTimeout, "SIGTERM"); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(stopAt); took > graceKillTimeout+time.Second {
		t.Errorf("stop took %s with a %s kill timeout", took, graceKillTimeout)
	}
	checkGrace(t, out, 2, stopAt, pids)
	status, err := h.InspectTask(cfg.ID)
	if err != nil || status.ExitResult == nil || status.ExitResult.ExitCode != supervisor.ExitStopped {
		t.Errorf("after stop: %v %+v; stderr:\n%s", err, status.ExitResult, stderr(t, cfg))
	}
	consulEmpty(t, "default/"+job)
}

// TestContainerMemberStopGivesTheRanksTheKillTimeout: the sidecar's
// container_kill_timeout reaches the supervisor in the container through
// its read-only spec; the supervisor, stopped as `docker stop` stops it (a
// SIGTERM, here without Docker), gives the ranks most of it and exits,
// having left the group, before docker's SIGKILL would come.
func TestContainerMemberStopGivesTheRanksTheKillTimeout(t *testing.T) {
	root := t.TempDir()
	h, runRoot, self := containerHarness(t, root)
	out := t.TempDir()
	job := "grace-ctr-" + uuid.Short()
	tc := graceTask(out)
	tc.ContainerTask, tc.CheckpointRoot, tc.ContainerKillTimeout = "train", root, graceKillTimeout.String()
	cfg := memberTask(t, h, job, 0, ports(t, 1)[0], "gpujob", tc)
	if _, _, err := h.StartTask(cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.DestroyTask(cfg.ID, true) })
	spec, err := supervisor.ReadSpec(filepath.Join(runRoot, cfg.AllocID, containermember.SpecName))
	if err != nil {
		t.Fatal(err)
	}
	if got := time.Duration(spec.KillTimeout); got != graceKillTimeout {
		t.Fatalf("the container's spec has kill timeout %s, want container_kill_timeout's %s", got, graceKillTimeout)
	}
	// The container's view of /alloc is the allocation's shared dir.
	spec.EventsFile = filepath.Join(cfg.AllocDir, "alloc", "gpujob", "train.events")
	local := filepath.Join(t.TempDir(), "spec.json")
	if err := supervisor.WriteSpec(local, spec); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, SuperviseCommand, local)
	logFile, err := os.Create(filepath.Join(t.TempDir(), "supervisor.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	logOf := func() string {
		b, _ := os.ReadFile(logFile.Name())
		return string(b)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	pids := waitRanksUp(t, out, 2, logOf)
	stopAt := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var err2 error
	select {
	case err2 = <-exited:
		exited <- err2 // for the cleanup
	case <-time.After(graceKillTimeout + 5*time.Second):
		t.Fatalf("the supervisor did not exit within %s of the stop:\n%s", graceKillTimeout+5*time.Second, logOf())
	}
	took := time.Since(stopAt)
	var ee *exec.ExitError
	if !errors.As(err2, &ee) || ee.ExitCode() != supervisor.ExitStopped {
		t.Errorf("the supervisor exited %v, want %d:\n%s", err2, supervisor.ExitStopped, logOf())
	}
	if took > graceKillTimeout {
		t.Errorf("the supervisor exited %s after the stop, past docker's SIGKILL at %s", took, graceKillTimeout)
	}
	checkGrace(t, out, 2, stopAt, pids)
	consulEmpty(t, "default/"+job)

	wait, err := h.WaitTask(context.Background(), cfg.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.StopTask(cfg.ID, graceKillTimeout, "SIGTERM"); err != nil {
		t.Fatal(err)
	}
	<-wait
}
