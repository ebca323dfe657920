package supervisor

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpujob/gpujob/driver/rendezvous"
	"github.com/gpujob/gpujob/internal/taskevent"
)

// fakeCoord is a scripted rendezvous: Join hands out rounds in order, then
// joinErr; the test ends a round remotely through end.
type fakeCoord struct {
	mu      sync.Mutex
	rounds  []*rendezvous.Round
	joinErr error
	failErr error // what Fail returns
	doneErr error // what Done returns
	joins   int
	fails   []rendezvous.Failure
	done    int
	watches map[int]chan rendezvous.Failure
	watched chan int // round numbers as Watch is called
}

func newFakeCoord(rounds int, joinErr error) *fakeCoord {
	c := &fakeCoord{joinErr: joinErr, watches: map[int]chan rendezvous.Failure{}, watched: make(chan int, 16)}
	self := rendezvous.Member{ID: "a1", Name: "job.g[0]", Addr: "127.0.0.1:29400", LocalWorldSize: 2}
	for i := 1; i <= rounds; i++ {
		c.rounds = append(c.rounds, &rendezvous.Round{Number: i, Restarts: i - 1, Members: []rendezvous.Member{self},
			NodeRank: 0, WorldSize: 2, RankOffset: 0, Master: self})
	}
	return c
}

func (c *fakeCoord) Join(ctx context.Context) (*rendezvous.Round, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.joins < len(c.rounds) {
		c.joins++
		return c.rounds[c.joins-1], nil
	}
	return nil, c.joinErr
}

func (c *fakeCoord) Watch(ctx context.Context, r *rendezvous.Round) <-chan rendezvous.Failure {
	c.mu.Lock()
	ch := make(chan rendezvous.Failure, 1)
	c.watches[r.Number] = ch
	c.mu.Unlock()
	c.watched <- r.Number
	return ch
}

func (c *fakeCoord) end(round int, f rendezvous.Failure) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.watches[round] <- f
}

func (c *fakeCoord) Fail(ctx context.Context, r *rendezvous.Round, f rendezvous.Failure) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fails = append(c.fails, f)
	return c.failErr
}

func (c *fakeCoord) Done(ctx context.Context, r *rendezvous.Round) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.done++
	return c.doneErr
}

// run runs a supervisor whose workers run script under /bin/sh; it returns
// the exit code, the events and the directory the script may write to.
func run(t *testing.T, ctx context.Context, coord *fakeCoord, script string) (int, []taskevent.Event, string) {
	t.Helper()
	return runIn(t, ctx, coord, t.TempDir(), script)
}

// runIn is run with the ranks' $STATE in dir, for a test that watches the
// ranks while they run.
func runIn(t *testing.T, ctx context.Context, coord *fakeCoord, dir, script string) (int, []taskevent.Event, string) {
	t.Helper()
	spec := &Spec{Command: "/bin/sh", Args: []string{"-c", script}, NProcPerNode: 2, MaxRestarts: 3,
		RunID: "default/job", Self: Member{ID: "a1", Name: "job.g[0]", Addr: "127.0.0.1:29400"},
		Min: 1, Max: 1, StopGrace: Duration(500 * time.Millisecond), EventsFile: filepath.Join(dir, "events.jsonl")}
	out := &safeBuffer{}
	sup, err := New(spec, coord, []string{"PATH=/usr/bin:/bin", "STATE=" + dir}, out, out)
	if err != nil {
		t.Fatal(err)
	}
	code := sup.Run(ctx)
	b, _ := os.ReadFile(spec.EventsFile)
	events, _ := ReadEvents(b)
	return code, events, dir
}

func messages(events []taskevent.Event) string {
	var m []string
	for _, e := range events {
		m = append(m, string(e.Kind)+": "+e.Message)
	}
	return strings.Join(m, "\n")
}

func TestSupervisorSucceeds(t *testing.T) {
	coord := newFakeCoord(1, nil)
	code, events, _ := run(t, context.Background(), coord, `test "$WORLD_SIZE" = 2 && test "$MASTER_PORT" = 29400`)
	if code != 0 || coord.done != 1 || len(coord.fails) != 0 {
		t.Fatalf("code %d done %d fails %v; events:\n%s", code, coord.done, coord.fails, messages(events))
	}
	got := messages(events)
	for _, want := range []string{
		"joined: joined round 1 as node 0 of 1 (ranks 0-1 of 2, master 127.0.0.1:29400)",
		"succeeded: all 2 local ranks exited 0",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("events lack %q:\n%s", want, got)
		}
	}
}

func TestSupervisorRunsRanksInWorkdir(t *testing.T) {
	coord := newFakeCoord(1, nil)
	dir := t.TempDir()
	spec := &Spec{Command: "/bin/sh", Args: []string{"-c", `pwd > "$OUT/pwd.$RANK"`}, NProcPerNode: 1,
		Workdir: dir, Env: map[string]string{"OUT": dir},
		RunID: "default/job", Self: Member{ID: "a1", Name: "job.g[0]", Addr: "127.0.0.1:1"}, Min: 1, Max: 1}
	sup, err := New(spec, coord, nil, &safeBuffer{}, &safeBuffer{})
	if err != nil {
		t.Fatal(err)
	}
	if code := sup.Run(context.Background()); code != 0 {
		t.Fatalf("exit %d", code)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "pwd.0"))
	if strings.TrimSpace(string(b)) != dir {
		t.Fatalf("rank ran in %q, want %q", strings.TrimSpace(string(b)), dir)
	}
}

func TestSupervisorLocalFailureRestartsTheGroup(t *testing.T) {
	coord := newFakeCoord(2, nil)
	// Rank 1 fails in the first round only; the restart count tells rounds apart.
	code, events, _ := run(t, context.Background(), coord,
		`if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ]; then exit 3; fi; sleep 0.2`)
	if code != 0 {
		t.Fatalf("code %d; events:\n%s", code, messages(events))
	}
	if len(coord.fails) != 1 || coord.fails[0].Reason != "rank 1 exited 3" || coord.fails[0].ExitCode != 3 {
		t.Fatalf("failures reported to the group: %+v", coord.fails)
	}
	if !strings.Contains(messages(events), "rank 1 exited 3: restarting group, 2 of 3 restarts left") {
		t.Errorf("no restart event:\n%s", messages(events))
	}
}

func TestSupervisorRemoteFailureStopsAndRejoins(t *testing.T) {
	coord := newFakeCoord(2, nil)
	done := make(chan struct{})
	var code int
	var events []taskevent.Event
	dir := t.TempDir()
	go func() {
		defer close(done)
		// Round 1's workers record their PIDs and hang; round 2's succeed.
		code, events, _ = runIn(t, context.Background(), coord, dir,
			`if [ "$GPUJOB_GENERATION" = 1 ]; then echo $$ > "$STATE/pid.$LOCAL_RANK"; exec sleep 60; fi`)
	}()
	<-coord.watched
	// Both workers run round 1.
	pidIn(t, filepath.Join(dir, "pid.0"))
	pidIn(t, filepath.Join(dir, "pid.1"))
	coord.end(1, rendezvous.Failure{Member: "job.g[1]", Reason: "rank 3 exited 137", ExitCode: 137})
	<-done
	if code != 0 || len(coord.fails) != 0 {
		t.Fatalf("code %d, own failures %v; events:\n%s", code, coord.fails, messages(events))
	}
	if !strings.Contains(messages(events), "round 1 ended by job.g[1] (rank 3 exited 137): restarting with the group") {
		t.Errorf("events:\n%s", messages(events))
	}
	for _, f := range []string{"pid.0", "pid.1"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatalf("round 1 worker did not start: %v", err)
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("round 1 worker %d still runs after the round ended", pid)
		}
	}
}

func TestSupervisorFailsWhenTheGroupCannotGoOn(t *testing.T) {
	coord := newFakeCoord(1, errors.New("restart budget exhausted: job.g[0]: rank 0 exited 5 (3 of 3 restarts used)"))
	code, events, _ := run(t, context.Background(), coord, `exit 5`)
	if code != 1 {
		t.Fatalf("code %d, want 1", code)
	}
	last := events[len(events)-1]
	if last.Kind != taskevent.Failed || !strings.Contains(last.Message, "rank 0 exited 5") {
		t.Errorf("last event %+v does not say why the group failed", last)
	}
}

func TestSupervisorStoppedByNomad(t *testing.T) {
	coord := newFakeCoord(1, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	dir := t.TempDir()
	go func() {
		// The PID is written once TERM is ignored: then the stop must
		// come to SIGKILL.
		code, _, _ := runIn(t, ctx, coord, dir, `trap "" TERM; echo $$ > "$STATE/pid.$LOCAL_RANK"; exec sleep 60`)
		done <- code
	}()
	<-coord.watched
	pidIn(t, filepath.Join(dir, "pid.0"))
	pidIn(t, filepath.Join(dir, "pid.1"))
	cancel()
	select {
	case code := <-done:
		if code != ExitStopped {
			t.Fatalf("code %d, want %d", code, ExitStopped)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("supervisor did not stop")
	}
	entries, _ := filepath.Glob(filepath.Join(dir, "pid.*"))
	if len(entries) != 2 {
		t.Fatalf("workers did not start: %v", entries)
	}
	for _, f := range entries {
		b, _ := os.ReadFile(f)
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("worker %d survived the stop", pid)
		}
	}
}

func TestSupervisorEventsAreStructured(t *testing.T) {
	coord := newFakeCoord(2, nil)
	_, events, _ := run(t, context.Background(), coord,
		`if [ "$GPUJOB_GENERATION" = 1 ] && [ "$RANK" = 1 ]; then exit 3; fi`)
	want := []taskevent.Event{
		{Kind: taskevent.Joined, Round: 1, NNodes: 1, FirstRank: 0, LastRank: 1, WorldSize: 2, Master: "127.0.0.1:29400", MaxRestarts: 3},
		{Kind: taskevent.Restarting, Round: 1, NNodes: 1, FirstRank: 0, LastRank: 1, WorldSize: 2, Master: "127.0.0.1:29400", MaxRestarts: 3,
			Failure: taskevent.Failure{Member: "job.g[0]", Reason: "rank 1 exited 3", ExitCode: 3}},
		{Kind: taskevent.Joined, Round: 2, NNodes: 1, FirstRank: 0, LastRank: 1, WorldSize: 2, Master: "127.0.0.1:29400", Restarts: 1, MaxRestarts: 3},
		{Kind: taskevent.Succeeded, Round: 2, NNodes: 1, FirstRank: 0, LastRank: 1, WorldSize: 2, Master: "127.0.0.1:29400", Restarts: 1, MaxRestarts: 3},
	}
	if len(events) != len(want) {
		t.Fatalf("events:\n%s", messages(events))
	}
	for i, e := range events {
		if e.Message != e.Describe() || e.Time.IsZero() {
			t.Errorf("event %d: message %q, time %v", i, e.Message, e.Time)
		}
		e.Message, e.Time = "", time.Time{}
		if e != want[i] {
			t.Errorf("event %d:\n got %+v\nwant %+v", i, e, want[i])
		}
	}
}

func TestSupervisorRankExitingZeroWithAChildHoldingItsOutput(t *testing.T) {
	coord := newFakeCoord(1, nil)
	// The background sleep keeps the rank's stdout pipe open after the rank
	// exits 0: the pipe's WaitDelay expires, the exit status still decides.
	code, events, dir := run(t, context.Background(), coord,
		`sleep 60 & echo $! > "$STATE/child.$LOCAL_RANK"; exit 0`)
	if code != 0 || coord.done != 1 || len(coord.fails) != 0 {
		t.Fatalf("code %d done %d fails %v; events:\n%s", code, coord.done, coord.fails, messages(events))
	}
	for _, f := range []string{"child.0", "child.1"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		if !eventually(func() bool { return !running(pid) }) {
			t.Errorf("the rank's child %d outlived the run", pid)
		}
	}
}

func TestSupervisorFailsWhenItCannotReportAFailure(t *testing.T) {
	coord := newFakeCoord(2, nil)
	coord.failErr = context.DeadlineExceeded
	code, events, _ := run(t, context.Background(), coord, `exit 4`)
	if code != 1 || coord.joins != 1 {
		t.Fatalf("code %d after %d joins, want 1 after 1; events:\n%s", code, coord.joins, messages(events))
	}
	last := events[len(events)-1]
	if last.Kind != taskevent.Failed || !strings.Contains(last.Failure.Reason, "exited 4; reporting it to the group failed") {
		t.Errorf("last event %+v", last)
	}
}

func TestSupervisorSucceedsWhenDoneFails(t *testing.T) {
	coord := newFakeCoord(1, nil)
	coord.doneErr = errors.New("consul unreachable")
	code, events, _ := run(t, context.Background(), coord, `exit 0`)
	if code != 0 {
		t.Fatalf("code %d; events:\n%s", code, messages(events))
	}
	last := events[len(events)-1]
	if last.Kind != taskevent.Succeeded || !strings.Contains(last.Warning, "consul unreachable") {
		t.Errorf("last event %+v does not say the success went unrecorded", last)
	}
}

func TestSupervisorStopFitsTheDeadline(t *testing.T) {
	coord := newFakeCoord(1, nil)
	dir := t.TempDir()
	deadlineFile := filepath.Join(dir, "deadline")
	spec := &Spec{Command: "/bin/sh", Args: []string{"-c", `trap "" TERM; touch "$STATE/up.$LOCAL_RANK"; exec sleep 60`},
		NProcPerNode: 2, RunID: "default/job", Self: Member{ID: "a1", Name: "job.g[0]", Addr: "127.0.0.1:1"}, Min: 1, Max: 1,
		StopGrace: Duration(time.Minute), StopDeadlineFile: deadlineFile}
	sup, err := New(spec, coord, []string{"PATH=/usr/bin:/bin", "STATE=" + dir}, &safeBuffer{}, &safeBuffer{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	go func() { done <- sup.Run(ctx) }()
	<-coord.watched
	eventually(func() bool {
		_, err := os.Stat(filepath.Join(dir, "up.1"))
		return err == nil
	})
	deadline := time.Now().Add(1500 * time.Millisecond)
	if err := WriteStopDeadline(deadlineFile, deadline); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case code := <-done:
		if code != ExitStopped {
			t.Fatalf("code %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stop ignored its deadline (a minute of grace)")
	}
	if now := time.Now(); now.After(deadline) {
		t.Errorf("ranks stopped %s after the deadline", now.Sub(deadline))
	}
	if leave := sup.LeaveDeadline(); leave.After(deadline) {
		t.Errorf("leaving the group may take until %s, past the deadline %s", leave, deadline)
	}
}

func TestPlanStop(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name     string
		deadline time.Duration
		have     bool
		grace    time.Duration
		leaveBy  time.Duration
	}{
		{"no deadline: the fixed grace, then a bounded leave", 0, false, 3 * time.Second, 13 * time.Second},
		{"nomad's default 5s", 5 * time.Second, true, 3 * time.Second, 4500 * time.Millisecond},
		{"a long kill_timeout goes to the ranks", 60 * time.Second, true, 54500 * time.Millisecond, 59500 * time.Millisecond},
		{"a short one is split too", 900 * time.Millisecond, true, 540 * time.Millisecond, 810 * time.Millisecond},
		{"already past", -time.Second, true, 0, 0},
	}
	for _, tt := range tests {
		p := planStop(now, now.Add(tt.deadline), tt.have, 3*time.Second)
		if p.grace != tt.grace || !p.leaveBy.Equal(now.Add(tt.leaveBy)) {
			t.Errorf("%s: grace %s leave by +%s, want %s and +%s", tt.name, p.grace, p.leaveBy.Sub(now), tt.grace, tt.leaveBy)
		}
	}
}

// running reports whether pid is a live process (not a zombie).
func running(pid int) bool {
	return syscall.Kill(pid, 0) == nil && !IsZombie(pid)
}

// eventually polls cond for up to 5 seconds.
func eventually(cond func() bool) bool {
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}
