package supervisor

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"
)

// helperEnv makes the test binary run a supervisor (helperSupervisor)
// instead of the tests, so a test can kill -9 a real supervisor process.
const helperEnv = "GPUJOB_TEST_SUPERVISOR_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(helperEnv); dir != "" {
		os.Exit(helperSupervisor(dir))
	}
	if v := os.Getenv(spentPidsEnv); v != "" {
		os.Exit(helperSpentPids(v))
	}
	if os.Getenv(openDevicesEnv) != "" {
		os.Exit(helperOpenDevices(os.Args[1:]))
	}
	if len(os.Args) > 1 && os.Args[1] == RunAsCommand {
		os.Exit(RunAsMain(os.Args[2:]))
	}
	os.Exit(m.Run())
}

// helperSupervisor runs one member whose two ranks write their PIDs to dir
// and then wait. Meanwhile goroutines keep exiting locked to their threads,
// which ends those threads: a rank whose parent-death signal fired with any
// of them would die early. (Whether Go would have handed the forking thread
// to one of them is up to its scheduler; the spawner makes it impossible.)
func helperSupervisor(dir string) int {
	go func() {
		for {
			var wg sync.WaitGroup
			for range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					// Exiting while locked ends this goroutine's thread.
					runtimeLockOSThread()
					time.Sleep(time.Millisecond)
				}()
			}
			wg.Wait()
		}
	}()
	spec := &Spec{Command: "/bin/sh", Args: []string{"-c", `echo $$ > "$STATE/rank.$LOCAL_RANK"; exec sleep 300`},
		NProcPerNode: 2, RunID: "default/job", Self: Member{ID: "a1", Name: "job.g[0]", Addr: "127.0.0.1:1"}, Min: 1, Max: 1}
	sup, err := New(spec, newFakeCoord(1, nil), []string{"PATH=/usr/bin:/bin", "STATE=" + dir}, os.Stdout, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return sup.Run(context.Background())
}

func TestRanksDieWithTheSupervisor(t *testing.T) {
	dir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), helperEnv+"="+dir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	ranks := []int{pidIn(t, filepath.Join(dir, "rank.0")), pidIn(t, filepath.Join(dir, "rank.1"))}
	// Locked threads came and went meanwhile: the ranks still run.
	time.Sleep(300 * time.Millisecond)
	for _, pid := range ranks {
		if !running(pid) {
			t.Fatalf("rank %d died while its supervisor lives", pid)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for _, pid := range ranks {
		if !eventually(func() bool { return !running(pid) }) {
			t.Errorf("rank %d outlived its killed supervisor", pid)
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// runtimeLockOSThread locks the calling goroutine to its thread and returns
// without unlocking, so the thread ends with the goroutine.
func runtimeLockOSThread() { runtime.LockOSThread() }
