package supervisor

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpujob/gpujob/internal/testpriv"
)

// threads is the process's thread count (/proc/self/status).
func threads(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no Threads: line in /proc/self/status")
	return 0
}

// The threads reserved stay after reserveThreads returns: a later
// blocking call finds one idle instead of creating one, which under a
// spent pids_limit it could not.
func TestReserveThreadsLeavesThemIdle(t *testing.T) {
	before := threads(t)
	const n = 40
	reserveThreads(n)
	if after := threads(t); after < n {
		t.Fatalf("%d threads after reserving %d (%d before): they did not stay", after, n, before)
	}
	// A second reservation of as many uses the idle ones: few new threads.
	mid := threads(t)
	reserveThreads(n)
	if after := threads(t); after > mid+4 {
		t.Errorf("reserving %d again started %d more threads: the first ones were not idle for reuse", n, after-mid)
	}
}

func TestReservedThreadsLeaveTheRanksTheirShare(t *testing.T) {
	for _, tc := range []struct{ nproc, max, want int }{
		{1, 4096, 18},
		{8, 4096, 32},
		{8, 64, 16}, // the least pids_limit: a quarter
		{64, 512, 128},
		{1, 0, 0}, // no limit set: nothing to reserve against
	} {
		if got := reservedThreads(tc.nproc, tc.max); got != tc.want {
			t.Errorf("reservedThreads(%d, %d) = %d, want %d", tc.nproc, tc.max, got, tc.want)
		}
	}
}

// spentPidsEnv makes the test binary run helperSpentPids: "CGROUP reserve"
// or "CGROUP none".
const spentPidsEnv = "GPUJOB_TEST_SPENT_PIDS"

// helperSpentPids enters the pids cgroup dir (reserving threads first, or
// not), spends its allowance (pids.max set to what it holds, as a rank's
// fork bomb leaves it), then has 16 goroutines block in system calls at
// once: each hand-off of a processor needs a thread.
func helperSpentPids(arg string) int {
	dir, mode, _ := strings.Cut(arg, " ")
	if mode == "reserve" {
		reserveThreads(reservedThreads(1, 4096))
	}
	if err := writeProcs(dir, os.Getpid()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cur, err := os.ReadFile(filepath.Join(dir, "pids.current"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := os.WriteFile(filepath.Join(dir, "pids.max"), bytes.TrimSpace(cur), 0); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ts := syscall.Timespec{Nsec: int64(200 * time.Millisecond)}
			_ = syscall.Nanosleep(&ts, nil)
		}()
	}
	wg.Wait()
	fmt.Println("survived")
	return 0
}

// A supervisor whose ranks spent the task's pids_limit keeps running: the
// threads it reserved serve its blocking calls. Without the reserve the
// same process dies in the Go runtime (exit 2, "failed to create new OS
// thread", or with cgo "pthread_create failed"), as the fork-bomb e2e test's supervisor once did in CI.
func TestSupervisorSurvivesASpentPidsLimit(t *testing.T) {
	testpriv.NeedRoot(t, "a pids cgroup")
	leaf := fmt.Sprintf("gpujob-test-threads-%d", os.Getpid())
	var dir string
	if unified() {
		dir = filepath.Join(cgroupRoot, leaf)
	} else if dir = PidsV1Cgroup(leaf); dir == "" {
		testpriv.Skip(t, "no cgroups v1 pids controller")
	}
	for _, tc := range []struct {
		mode     string
		survives bool
	}{{"none", false}, {"reserve", true}} {
		t.Run(tc.mode, func(t *testing.T) {
			if err := os.Mkdir(dir, 0o755); err != nil {
				testpriv.Skip(t, "cannot make a pids cgroup here: %v", err)
			}
			defer func() {
				if err := os.Remove(dir); err != nil {
					t.Errorf("removing %s: %v", dir, err)
				}
			}()
			if _, err := os.Stat(filepath.Join(dir, "pids.max")); err != nil {
				testpriv.Skip(t, "the cgroup %s has no pids controller: %v", dir, err)
			}
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), spentPidsEnv+"="+dir+" "+tc.mode)
			out, err := cmd.CombinedOutput()
			survived := err == nil && strings.Contains(string(out), "survived")
			if survived != tc.survives {
				t.Fatalf("with %s reserved: survived %v (%v), want %v:\n%.2000s", tc.mode, survived, err, tc.survives, out)
			}
			// The runtime's words without cgo, and with it.
			if !tc.survives && !strings.Contains(string(out), "failed to create new OS thread") &&
				!strings.Contains(string(out), "pthread_create failed") {
				t.Fatalf("without a reserve the helper died otherwise than for want of a thread (%v, %d bytes):\n%.2000s", err, len(out), out)
			}
		})
	}
}
