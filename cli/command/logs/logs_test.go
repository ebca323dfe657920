package logs

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gpujobs/fixture"
	"github.com/gpujob/gpujob/cli/iostreams"
	"github.com/gpujob/gpujob/cli/nomadapi"
)

// syncBuffer is safe to read while the command writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func execute(ctx context.Context, f *nomadapi.Fake, args ...string) (*syncBuffer, *syncBuffer, error) {
	out, errOut := &syncBuffer{}, &syncBuffer{}
	err := start(ctx, f, out, errOut, args...)
	return out, errOut, err
}

func start(ctx context.Context, f *nomadapi.Fake, out, errOut *syncBuffer, args ...string) error {
	ios := &iostreams.IOStreams{In: &bytes.Buffer{}, Out: out, ErrOut: errOut}
	fac := &factory.Factory{IO: ios, Nomad: func() (nomadapi.API, error) { return f, nil }, Now: func() time.Time { return fixture.Epoch }}
	cmd := NewCmd(fac)
	cmd.SetArgs(args)
	cmd.SetOut(out)
	cmd.SetErr(errOut)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	return cmd.ExecuteContext(ctx)
}

// mixed: bert with member 0 (one process, rank 0, unprefixed lines),
// member 1 (four processes, ranks 1-4, prefixed lines) and member 2 not
// started.
func mixed() *nomadapi.Fake {
	f := nomadapi.NewFake()
	job := fixture.TrainJob("bert", 3, 1)
	f.SetJob(job)
	f.SetAlloc(fixture.Alloc(job, "a0", 0, nil, "running", nil, fixture.Joined(1, 0, 3, 0, 0, 6, "127.0.0.1:1")))
	f.SetAlloc(fixture.Alloc(job, "a1", 1, nil, "running", nil, fixture.Joined(1, 1, 3, 1, 4, 6, "127.0.0.1:1")))
	f.SetAlloc(fixture.Alloc(job, "a2", 2, nil, "pending", nil))
	f.SetLog("a0", "train", "stdout", "zero one\nzero ", "two\n", "zero three")
	f.SetLog("a1", "train", "stdout",
		"[rank 1] one a\n[rank 2] two a\n",
		"[rank 3] three a\n[rank 2] two b\nsupervisor line\n[rank 4] four a\n")
	f.SetLog("a0", "train", "stderr", "gpujob: joined round 1 as node 0 of 3 (rank 0 of 6, master 127.0.0.1:1)\n")
	return f
}

func TestLogsMerged(t *testing.T) {
	out, errOut, err := execute(context.Background(), mixed(), "bert")
	if err != nil {
		t.Fatal(err)
	}
	want := `[rank 0] zero one
[rank 0] zero two
[rank 0] zero three
[rank 1] one a
[rank 2] two a
[rank 3] three a
[rank 2] two b
[ranks 1-4] supervisor line
[rank 4] four a
`
	if out.String() != want {
		t.Errorf("output:\n%s\nwant:\n%s", out, want)
	}
	if !strings.Contains(errOut.String(), "bert.train[2] (a2) has not started yet") {
		t.Errorf("stderr: %q", errOut)
	}
}

func TestLogsRank(t *testing.T) {
	tests := []struct {
		args []string
		want string
		err  string
	}{
		{args: []string{"bert", "--rank", "0"}, want: "[rank 0] zero one\n[rank 0] zero two\n[rank 0] zero three\n"},
		{args: []string{"bert", "--rank", "2"}, want: "[rank 2] two a\n[rank 2] two b\n"},
		{args: []string{"bert", "--rank", "4"}, want: "[rank 4] four a\n"},
		{args: []string{"bert", "--rank", "9"}, err: `job "bert" has no rank 9: its ranks are 0-5`},
		{args: []string{"bert", "--rank", "-1"}, err: "--rank must be 0 or more"},
		{args: []string{"bert", "--stderr", "--rank", "0"}, want: "[rank 0] gpujob: joined round 1 as node 0 of 3 (rank 0 of 6, master 127.0.0.1:1)\n"},
		{args: []string{"nope"}, err: `job "nope" not found`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			out, _, err := execute(context.Background(), mixed(), tt.args...)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if out.String() != tt.want {
				t.Errorf("output:\n%s\nwant:\n%s", out, tt.want)
			}
		})
	}
}

func TestLogsRankBeforeJoin(t *testing.T) {
	f := nomadapi.NewFake()
	job := fixture.TrainJob("bert", 2, 1)
	f.SetJob(job)
	f.SetAlloc(waiting(job))
	f.SetLog("a0", "train", "stdout", "early\n")
	if _, _, err := execute(context.Background(), f, "bert", "--rank", "0"); err == nil ||
		!strings.Contains(err.Error(), "has joined a rendezvous round yet") {
		t.Errorf("err = %v", err)
	}
	out, _, err := execute(context.Background(), f, "bert")
	if err != nil || out.String() != "[bert.train[0]] early\n" {
		t.Errorf("unranked member: %q, %v", out, err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestLogsFollow(t *testing.T) {
	f := nomadapi.NewFake()
	job := fixture.TrainJob("bert", 2, 1)
	f.SetJob(job)
	f.SetAlloc(fixture.Alloc(job, "a0", 0, nil, "running", nil, fixture.Joined(1, 0, 2, 0, 0, 2, "m:1")))
	f.SetAlloc(fixture.Alloc(job, "a1", 1, nil, "running", nil, fixture.Joined(1, 1, 2, 1, 1, 2, "m:1")))
	f.SetLog("a0", "train", "stdout", "a first\n")
	f.SetLog("a1", "train", "stdout", "b first\n")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, errOut := &syncBuffer{}, &syncBuffer{}
	done := make(chan error, 1)
	go func() { done <- start(ctx, f, out, errOut, "bert", "-f") }()

	waitFor(t, "the first lines", func() bool {
		return strings.Contains(out.String(), "[rank 0] a first") && strings.Contains(out.String(), "[rank 1] b first")
	})
	f.AppendLog("a0", "train", "stdout", "a sec", "ond\n")
	waitFor(t, "a line in two frames", func() bool { return strings.Contains(out.String(), "[rank 0] a second\n") })

	// member 1 is lost and replaced; the replacement joins round 2
	f.UpdateAlloc("a1", func(a *api.Allocation) { a.ClientStatus = "lost" })
	repl := fixture.Alloc(job, "a1-new", 1, nil, "running", nil, fixture.Joined(2, 1, 2, 1, 1, 2, "m:2"))
	f.SetLog("a1-new", "train", "stdout", "c first\n")
	f.SetAlloc(repl)
	waitFor(t, "the replacement's line", func() bool { return strings.Contains(out.String(), "[rank 1] c first") })

	// member 0 writes its last lines and ends: they are printed once
	f.AppendLog("a0", "train", "stdout", "a last\nno newline")
	f.UpdateAlloc("a0", func(a *api.Allocation) { a.ClientStatus = "complete" })
	f.AppendLog("a1-new", "train", "stdout", "c done\n")
	f.UpdateAlloc("a1-new", func(a *api.Allocation) { a.ClientStatus = "complete" })

	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatalf("follow did not end when every member ended; output:\n%s", out)
	}
	got := out.String()
	for _, line := range []string{"[rank 0] a first", "[rank 1] b first", "[rank 0] a second", "[rank 0] a last",
		"[rank 0] no newline", "[rank 1] c first", "[rank 1] c done"} {
		if n := strings.Count(got, line+"\n"); n != 1 {
			t.Errorf("%q printed %d times:\n%s", line, n, got)
		}
	}
	if strings.Count(got, "\n") != 7 {
		t.Errorf("unexpected lines:\n%s", got)
	}
	if errOut.String() != "" {
		t.Errorf("stderr: %s", errOut)
	}
}

func TestLogsFollowStopsOnCancel(t *testing.T) {
	f := nomadapi.NewFake()
	job := fixture.TrainJob("bert", 1, 1)
	f.SetJob(job)
	f.SetAlloc(fixture.Alloc(job, "a0", 0, nil, "running", nil, fixture.Joined(1, 0, 1, 0, 0, 1, "m:1")))
	f.SetLog("a0", "train", "stdout", "x\n")
	ctx, cancel := context.WithCancel(context.Background())
	out, errOut := &syncBuffer{}, &syncBuffer{}
	done := make(chan error, 1)
	go func() { done <- start(ctx, f, out, errOut, "bert", "--follow", "--rank", "0") }()
	waitFor(t, "the line", func() bool { return out.String() == "[rank 0] x\n" })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Ctrl-C is a normal end of follow: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("follow did not stop on cancel")
	}
}

func TestLogsFollowRankOfLateJoiner(t *testing.T) {
	f := nomadapi.NewFake()
	job := fixture.TrainJob("bert", 1, 1)
	f.SetJob(job)
	f.SetAlloc(waiting(job))
	f.SetLog("a0", "train", "stdout", "before the join\n")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, errOut := &syncBuffer{}, &syncBuffer{}
	done := make(chan error, 1)
	go func() { done <- start(ctx, f, out, errOut, "bert", "-f", "--rank", "0") }()

	// the rank is unknown until the member joins; then it is found again
	// from the allocation's events
	f.UpdateAlloc("a0", func(a *api.Allocation) {
		ts := a.TaskStates["train"]
		ts.Events = append(ts.Events, fixture.DriverEvent(fixture.Joined(1, 0, 1, 0, 0, 1, "m:1"), fixture.Epoch))
	})
	f.AppendLog("a0", "train", "stdout", "after the join\n")
	waitFor(t, "the line after the join", func() bool { return strings.Contains(out.String(), "[rank 0] after the join\n") })
	f.UpdateAlloc("a0", func(a *api.Allocation) { a.ClientStatus = "complete" })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// "before the join" is shown as rank 0's or not at all, depending on
	// whether it was read before the join event: never unprefixed
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if !strings.HasPrefix(l, "[rank 0] ") {
			t.Errorf("line %q is not rank 0's", l)
		}
	}
}

// waiting is member 0 of job, running but not yet in a round: its only
// event is a driver message without gpujob details.
func waiting(job *api.Job) *api.Allocation {
	a := fixture.Alloc(job, "a0", 0, nil, "running", nil)
	ts := a.TaskStates["train"]
	ts.Events = append(ts.Events, fixture.PlainDriverEvent("waiting for the group", fixture.Epoch))
	return a
}
