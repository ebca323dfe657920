package supervisor

import (
	"bytes"
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
	w, err := startWorkers(spec, Placement{WorldSize: 2, MasterAddr: "h:1"}, nil, out, out)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for strings.Count(out.String(), "child") < 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	var pids []int
	for _, c := range w.cmds {
		pids = append(pids, c.Process.Pid)
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
	w, err := startWorkers(spec, Placement{RankOffset: 4, WorldSize: 5, MasterAddr: "h:1"}, nil, &bytes.Buffer{}, &bytes.Buffer{})
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
