package supervisor

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestLineWriterPrefixesWholeLines(t *testing.T) {
	var out bytes.Buffer
	var mu sync.Mutex
	w := &lineWriter{prefix: "[rank 3] ", out: &out, mu: &mu}
	w.Write([]byte("loss=0.5\nloss="))
	w.Write([]byte("0.4\npartial"))
	if got := out.String(); got != "[rank 3] loss=0.5\n[rank 3] loss=0.4\n" {
		t.Fatalf("before flush: %q", got)
	}
	w.flush()
	if got := out.String(); !strings.HasSuffix(got, "[rank 3] partial\n") {
		t.Fatalf("after flush: %q", got)
	}
}

func TestStopKillsProcessGroups(t *testing.T) {
	// Each worker starts a child that ignores SIGTERM: stop must still leave
	// nothing behind once the grace runs out.
	spec := &Spec{Command: "/bin/sh", NProcPerNode: 2, Args: []string{"-c",
		`sh -c 'trap "" TERM; echo child $$; sleep 60' & wait`}}
	out := &safeBuffer{}
	w, err := startWorkers(spec, Placement{WorldSize: 2, MasterAddr: "h:1"}, nil, out, out, startDirect)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for strings.Count(out.String(), "child") < 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	var pids []int
	for _, c := range w.procs {
		pids = append(pids, c.pid)
	}
	start := time.Now()
	w.stop(300 * time.Millisecond)
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("stop took %s", d)
	}
	for _, pid := range pids {
		// The group leader is reaped; a member of its group would answer
		// kill(-pgid, 0). Killed orphans linger as zombies until init reaps
		// them, so allow it a moment.
		gone := time.Now().Add(2 * time.Second)
		for syscall.Kill(-pid, 0) == nil && time.Now().Before(gone) {
			time.Sleep(10 * time.Millisecond)
		}
		if err := syscall.Kill(-pid, 0); err == nil {
			t.Errorf("process group %d still has members after stop", pid)
		}
	}
}

func TestExitCodes(t *testing.T) {
	spec := &Spec{Command: "/bin/sh", NProcPerNode: 1, Args: []string{"-c", `kill -9 $$`}}
	w, err := startWorkers(spec, Placement{RankOffset: 4, WorldSize: 5, MasterAddr: "h:1"}, nil, &bytes.Buffer{}, &bytes.Buffer{}, startDirect)
	if err != nil {
		t.Fatal(err)
	}
	e := <-w.exits
	if e.Code != 137 || e.Rank != 4 || e.Err != nil {
		t.Fatalf("exit = %+v, want code 137 (128+SIGKILL) for rank 4", e)
	}
}

type safeBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *safeBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *safeBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startDirect starts a worker from the test's goroutine: these tests do not
// need the spawner's thread.
func startDirect(cmd *exec.Cmd) error { return cmd.Start() }

// pidIn reads a PID a rank wrote.
func pidIn(t *testing.T, path string) int {
	t.Helper()
	var pid int
	if !eventually(func() bool {
		b, err := os.ReadFile(path)
		if err != nil {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	}) {
		t.Fatalf("%s was never written", path)
	}
	return pid
}

func TestSignalReachesTheRankNotItsChildren(t *testing.T) {
	dir := t.TempDir()
	// The rank handles USR1; its child (as a DataLoader worker would) does
	// not, and would die of it.
	spec := &Spec{Command: "/bin/sh", NProcPerNode: 1, Env: map[string]string{"OUT": dir}, Args: []string{"-c",
		`trap 'echo usr1 > "$OUT/sig"' USR1; sleep 60 & echo $! > "$OUT/child"; while :; do sleep 0.05; done`}}
	w, err := startWorkers(spec, Placement{WorldSize: 1, MasterAddr: "h:1"}, nil, &safeBuffer{}, &safeBuffer{}, startDirect)
	if err != nil {
		t.Fatal(err)
	}
	defer w.stop(0)
	child := pidIn(t, filepath.Join(dir, "child"))
	w.signal(syscall.SIGUSR1)
	if !eventually(func() bool { _, err := os.Stat(filepath.Join(dir, "sig")); return err == nil }) {
		t.Fatal("the rank never got SIGUSR1")
	}
	if !running(child) {
		t.Error("SIGUSR1 reached the rank's child")
	}
	w.stop(time.Second)
	if !eventually(func() bool { return !running(child) }) {
		t.Error("stopping did not reach the rank's child")
	}
}

func TestKillGroupsKillsWhatTheRanksLeft(t *testing.T) {
	dir := t.TempDir()
	// A rank whose child stays behind in its group after the rank is gone.
	spec := &Spec{Command: "/bin/sh", NProcPerNode: 1, Env: map[string]string{"OUT": dir}, Args: []string{"-c",
		`sleep 60 & echo $! > "$OUT/child"; exec sleep 60`}}
	w, err := startWorkers(spec, Placement{WorldSize: 1, MasterAddr: "h:1"}, nil, &safeBuffer{}, &safeBuffer{}, startDirect)
	if err != nil {
		t.Fatal(err)
	}
	defer w.stop(0)
	child := pidIn(t, filepath.Join(dir, "child"))
	// A live process that is not ours, recorded under its PID with another
	// start time: a reused PID.
	other := exec.Command("sleep", "60")
	other.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { other.Process.Kill(); other.Wait() }()
	start, err := processStart(other.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "groups.json")
	records := append(w.groups, ProcessGroup{PGID: other.Process.Pid, StartTicks: start + 1})
	if err := writeGroups(path, records); err != nil {
		t.Fatal(err)
	}
	// The rank itself is gone; its child is left.
	syscall.Kill(w.procs[0].pid, syscall.SIGKILL)
	<-w.done
	killed, err := KillGroups(path)
	if err != nil || len(killed) != 1 || killed[0] != w.groups[0].PGID {
		t.Fatalf("killed %v, %v; want the rank's group %d only", killed, err, w.groups[0].PGID)
	}
	if !eventually(func() bool { return !running(child) }) {
		t.Error("the rank's child survived KillGroups")
	}
	if !running(other.Process.Pid) {
		t.Error("KillGroups killed a process that only reused a recorded PID")
	}
}

func TestProcessStartIsStable(t *testing.T) {
	a, err := processStart(os.Getpid())
	if err != nil || a == 0 {
		t.Fatalf("processStart = %d, %v", a, err)
	}
	if b, _ := processStart(os.Getpid()); a != b {
		t.Errorf("start time changed: %d then %d", a, b)
	}
	if _, err := processStart(1 << 30); err == nil {
		t.Error("a PID that cannot exist has a start time")
	}
}

// A rank that prints without ever ending its line gets it passed on in
// pieces: the supervisor holds at most maxLineBytes of it.
func TestLineWriterBoundsAnEndlessLine(t *testing.T) {
	var out bytes.Buffer
	var mu sync.Mutex
	l := &lineWriter{prefix: "[rank 0] ", out: &out, mu: &mu}
	chunk := bytes.Repeat([]byte("x"), 32<<10)
	for i := 0; i < 64; i++ { // 2 MiB, no newline
		if _, err := l.Write(chunk); err != nil {
			t.Fatal(err)
		}
		if len(l.buf) > maxLineBytes {
			t.Fatalf("after %d KiB the writer holds %d bytes", (i+1)*32, len(l.buf))
		}
	}
	lines := bytes.Split(bytes.TrimSuffix(out.Bytes(), []byte("\n")), []byte("\n"))
	if len(lines) != 31 || !bytes.HasPrefix(lines[0], []byte("[rank 0] xxx")) || len(lines[0]) != len("[rank 0] ")+maxLineBytes {
		t.Fatalf("%d pieces, the first %d bytes", len(lines), len(lines[0]))
	}
	l.flush()
	if got := out.Len(); got != 32*(len("[rank 0] ")+maxLineBytes+1) {
		t.Errorf("after flush %d bytes were passed on, want all 2 MiB in 32 prefixed pieces", got)
	}
}
