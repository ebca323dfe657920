package supervisor

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fakeZygote starts an interpreter that forks one child and prints its PID;
// lead says whether the child leads its own process group.
func fakeZygote(t *testing.T, lead bool) (zygote *exec.Cmd, child int) {
	t.Helper()
	setpgid := ""
	if lead {
		setpgid = "os.setpgid(0, 0); "
	}
	cmd := exec.Command(python(t), "-c", "import os, sys, time\n"+
		"pid = os.fork()\n"+
		"if pid == 0:\n    "+setpgid+"time.sleep(60); os._exit(0)\n"+
		"print(pid, flush=True)\ntime.sleep(60)\n")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-child, syscall.SIGKILL)
		_ = syscall.Kill(child, syscall.SIGKILL)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if child, err = strconv.Atoi(strings.TrimSpace(line)); err != nil {
		t.Fatal(err)
	}
	// Give the child its setpgid.
	deadline := time.Now().Add(5 * time.Second)
	for lead && time.Now().Before(deadline) {
		if info, err := readProcInfo(child); err == nil && info.pgrp == child {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	return cmd, child
}

func TestForkedRankChecksTheZygotesReport(t *testing.T) {
	uid := uint32(os.Geteuid())
	zyg, child := fakeZygote(t, true)
	bystander := exec.Command("sleep", "60")
	if err := bystander.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bystander.Process.Kill(); _ = bystander.Wait() })
	_, notLeader := fakeZygote(t, false)

	cases := []struct {
		name    string
		pid     int
		zygote  int
		uid     uint32
		wantErr string
	}{
		{"init", 1, zyg.Process.Pid, uid, "cannot be"},
		{"zero", 0, zyg.Process.Pid, uid, "cannot be"},
		{"a negative PID", -5, zyg.Process.Pid, uid, "cannot be"},
		{"the supervisor itself", os.Getpid(), zyg.Process.Pid, uid, "cannot be"},
		{"another process of the machine", bystander.Process.Pid, zyg.Process.Pid, uid, "its parent is process"},
		{"another zygote's child", notLeader, zyg.Process.Pid, uid, "its parent is process"},
		{"a process that does not exist", 1 << 22, zyg.Process.Pid, uid, "reported process"},
		{"the child, but as another user", child, zyg.Process.Pid, uid + 1, "not the ranks'"},
		{"the child", child, zyg.Process.Pid, uid, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fd, group, err := forkedRank(c.pid, c.zygote, c.uid)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fd)
			if group.PGID != c.pid || group.StartTicks == 0 || !group.ours() {
				t.Errorf("group %+v, want the child's own", group)
			}
		})
	}
	// A child that does not lead its group is refused too.
	if _, _, err := forkedRank(notLeader, parentOf(t, notLeader), uid); err == nil || !strings.Contains(err.Error(), "does not lead its own process group") {
		t.Errorf("a child in its parent's group: %v", err)
	}
	if IsZombie(bystander.Process.Pid) {
		t.Errorf("the bystander was killed")
	}
}

func parentOf(t *testing.T, pid int) int {
	t.Helper()
	info, err := readProcInfo(pid)
	if err != nil {
		t.Fatal(err)
	}
	return info.ppid
}

// TestAHostilePreloadCannotMakeTheSupervisorKill is issue 23's second
// attack: a preloaded module (the job's code, running in the zygote) makes
// os.fork report another process's PID, here a process of the supervisor's
// own user in another session. The supervisor must refuse the report,
// signal nothing on its word, and fail the round saying why.
func TestAHostilePreloadCannotMakeTheSupervisorKill(t *testing.T) {
	py := python(t)
	victim := exec.Command("sleep", "60")
	victim.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = victim.Process.Kill(); _ = victim.Wait() })
	modDir := t.TempDir()
	evil := "import os\n_real_fork = os.fork\n" +
		"def fork():\n    pid = _real_fork()\n    return pid if pid == 0 else int(os.environ['VICTIM'])\n" +
		"os.fork = fork\n"
	if err := os.WriteFile(filepath.Join(modDir, "evilz.py"), []byte(evil), 0o644); err != nil {
		t.Fatal(err)
	}
	script := writeScript(t, "import time\ntime.sleep(30)\n")
	spec := &Spec{Command: py, Args: []string{script}, NProcPerNode: 1, Workdir: t.TempDir(), Preload: []string{"evilz"}}
	base := []string{"PATH=/usr/bin:/bin", "PYTHONPATH=" + modDir, "VICTIM=" + strconv.Itoa(victim.Process.Pid)}
	pool, err := newZygotes(spec, base, os.Stderr, startDirect)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.close)
	if warning := pool.prepare(t.Context()); warning != "" {
		t.Fatalf("preload: %s", warning)
	}
	out := &safeBuffer{}
	w, err := startWorkersWith(spec, Placement{MasterAddr: "127.0.0.1:1", WorldSize: 1}, base, out, out, startDirect, pool, nil)
	if err == nil {
		w.stop(time.Second)
		t.Fatal("the round started on a forged fork report")
	}
	if !strings.Contains(err.Error(), "its parent is process") {
		t.Errorf("error %v, want the failed check named", err)
	}
	// The failed round's kills and the zygote's end happened before
	// startWorkersWith returned; the victim must have outlived them.
	// The test is the victim's parent: killed, it would stay a zombie
	// until reaped, which a signal 0 does not tell.
	if IsZombie(victim.Process.Pid) {
		t.Fatalf("the victim (PID %d) was killed on the zygote's word", victim.Process.Pid)
	}
}
