package supervisor

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpujob/gpujob/driver/rendezvous"
	"github.com/gpujob/gpujob/internal/sweep/report"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
	"github.com/gpujob/gpujob/internal/taskevent"
)

// fakeTrial records what the supervisor does with a trial; a stop request
// sent on stop reaches the watch, requested is what a read finds.
type fakeTrial struct {
	mu        sync.Mutex
	reporting []bool
	lines     []string
	closes    int
	stop      chan sweepkv.StopRequest
	watching  chan struct{} // closed once the watch runs
	requested *sweepkv.StopRequest
}

func newFakeTrial() *fakeTrial {
	return &fakeTrial{stop: make(chan sweepkv.StopRequest, 1), watching: make(chan struct{})}
}

func (f *fakeTrial) SetReporting(ctx context.Context, on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reporting = append(f.reporting, on)
}

func (f *fakeTrial) RankZeroOutput() io.WriteCloser {
	w := report.NewLineWriter(func(l string) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.lines = append(f.lines, l)
	})
	return closeCounter{w, f}
}

type closeCounter struct {
	*report.LineWriter
	f *fakeTrial
}

func (c closeCounter) Close() error {
	c.f.mu.Lock()
	c.f.closes++
	c.f.mu.Unlock()
	return c.LineWriter.Close()
}

func (f *fakeTrial) WatchStop(ctx context.Context, stop func(sweepkv.StopRequest)) {
	close(f.watching)
	select {
	case <-ctx.Done():
	case req := <-f.stop:
		stop(req)
	}
}

func (f *fakeTrial) StopRequested(ctx context.Context) (sweepkv.StopRequest, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.requested == nil {
		return sweepkv.StopRequest{}, false, nil
	}
	return *f.requested, true, nil
}

func (f *fakeTrial) request(req sweepkv.StopRequest) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requested = &req
}

// blockingCoord is fakeCoord whose Join, past its rounds, waits for ctx.
type blockingCoord struct{ *fakeCoord }

func (c blockingCoord) Join(ctx context.Context) (*rendezvous.Round, error) {
	c.mu.Lock()
	more := c.joins < len(c.rounds)
	c.mu.Unlock()
	if more {
		return c.fakeCoord.Join(ctx)
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

// runTrial runs a trial's supervisor with nproc ranks of script; it
// returns the exit code, the events, the ranks' state directory, the
// task's stdout and the supervisor.
func runTrial(t *testing.T, ctx context.Context, coord Coordinator, trial Trial, nproc int, script string) (int, []taskevent.Event, string, string, *Supervisor) {
	t.Helper()
	return runTrialIn(t, ctx, coord, trial, nproc, t.TempDir(), script)
}

// runTrialIn is runTrial with the ranks' $STATE in dir, for a test that
// watches the ranks while they run.
func runTrialIn(t *testing.T, ctx context.Context, coord Coordinator, trial Trial, nproc int, dir, script string) (int, []taskevent.Event, string, string, *Supervisor) {
	t.Helper()
	spec := &Spec{Command: "/bin/sh", Args: []string{"-c", script}, NProcPerNode: nproc, LogPrefix: nproc > 1, MaxRestarts: 3,
		RunID: "default/job", Self: Member{ID: "a1", Name: "job.g[0]", Addr: "127.0.0.1:29400"}, Expected: []string{"job.g[0]"},
		Min: 1, Max: 1, StopGrace: Duration(500 * time.Millisecond), EventsFile: filepath.Join(dir, "events.jsonl"),
		Report: &ReportSpec{MetricsKey: "m", StopKey: "s"}}
	out := &safeBuffer{}
	sup, err := New(spec, coord, []string{"PATH=/usr/bin:/bin", "STATE=" + dir}, out, &safeBuffer{})
	if err != nil {
		t.Fatal(err)
	}
	sup.SetTrial(trial)
	code := sup.Run(ctx)
	b, _ := os.ReadFile(spec.EventsFile)
	events, _ := ReadEvents(b)
	return code, events, dir, out.String(), sup
}

var ashaStop = sweepkv.StopRequest{Reason: "stopped by ASHA at step 120: 0.71 < rung cut 0.78", At: time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)}

// ranksGone checks that every rank that wrote its PID into dir is gone.
func ranksGone(t *testing.T, dir string, want int) {
	t.Helper()
	entries, _ := filepath.Glob(filepath.Join(dir, "pid.*"))
	if len(entries) != want {
		t.Fatalf("%d ranks started, want %d", len(entries), want)
	}
	for _, f := range entries {
		pid := readPID(f)
		if pid <= 0 {
			// Probing PID 0 would ask about our own process group.
			t.Errorf("%s holds no PID", f)
			continue
		}
		if !eventually(func() bool { return !running(pid) }) {
			t.Errorf("rank %d survived the trial's stop", pid)
		}
	}
}

// readPID is the PID a rank wrote into path; 0 while it has not.
func readPID(path string) int {
	b, _ := os.ReadFile(path)
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

func lastEvent(t *testing.T, events []taskevent.Event) taskevent.Event {
	t.Helper()
	if len(events) == 0 {
		t.Fatal("no events")
	}
	return events[len(events)-1]
}

func TestTrialStopRequestStopsTheRanksAndExitsZero(t *testing.T) {
	coord := newFakeCoord(1, nil)
	trial := newFakeTrial()
	dir := t.TempDir()
	go func() {
		<-coord.watched
		// The stop comes once both ranks run (have written their PIDs:
		// the file exists before the shell has written into it, and a
		// rank stopped in between leaves it empty).
		for _, f := range []string{"pid.0", "pid.1"} {
			eventually(func() bool { return readPID(filepath.Join(dir, f)) > 0 })
		}
		trial.stop <- ashaStop
	}()
	began := time.Now()
	code, events, _, _, sup := runTrialIn(t, context.Background(), coord, trial, 2, dir,
		`echo $$ > "$STATE/pid.$LOCAL_RANK"; exec sleep 60`)
	if code != 0 || !sup.TrialStopped() {
		t.Fatalf("code %d, trial stopped %v; events:\n%s", code, sup.TrialStopped(), messages(events))
	}
	if d := time.Since(began); d > 5*time.Second {
		t.Errorf("stopping took %s", d)
	}
	ranksGone(t, dir, 2)
	e := lastEvent(t, events)
	if e.Kind != taskevent.TrialStopped || e.Message != ashaStop.Reason || e.Stop.Reason != ashaStop.Reason ||
		!e.Stop.At.Equal(ashaStop.At) || e.Round != 1 {
		t.Errorf("last event %+v, want a trial_stopped event of round 1 saying %q", e, ashaStop.Reason)
	}
	if coord.done != 1 || len(coord.fails) != 0 {
		t.Errorf("done %d, failures %v: the member must leave its round done, not failed", coord.done, coord.fails)
	}
	if !reflect.DeepEqual(trial.reporting, []bool{true, true}) {
		t.Errorf("reporting %v, want it on before the round and for the round (this member hosts rank 0)", trial.reporting)
	}
}

func TestTrialStopWhileWaitingForTheGroup(t *testing.T) {
	coord := blockingCoord{newFakeCoord(0, nil)}
	trial := newFakeTrial()
	go func() {
		<-trial.watching
		trial.stop <- ashaStop
	}()
	code, events, _, _, sup := runTrial(t, context.Background(), coord, trial, 1, `exit 0`)
	if code != 0 || !sup.TrialStopped() {
		t.Fatalf("code %d; events:\n%s", code, messages(events))
	}
	if e := lastEvent(t, events); e.Kind != taskevent.TrialStopped || e.Round != 0 || e.Message != ashaStop.Reason {
		t.Errorf("last event %+v", e)
	}
	if coord.done != 0 {
		t.Errorf("marked done %d times without a round", coord.done)
	}
}

// A member whose ranks fail because another member stopped its own ranks
// for the trial's stop, before this member's watch fired, stops too: no
// failure reported to the group, no restart.
func TestRankFailureAfterTheTrialsStopIsNoRestart(t *testing.T) {
	coord := newFakeCoord(2, nil)
	trial := newFakeTrial()
	trial.request(ashaStop)
	code, events, _, _, sup := runTrial(t, context.Background(), coord, trial, 2, `exit 3`)
	if code != 0 || !sup.TrialStopped() || len(coord.fails) != 0 || coord.joins != 1 {
		t.Fatalf("code %d, failures %v, joins %d; events:\n%s", code, coord.fails, coord.joins, messages(events))
	}
	for _, e := range events {
		if e.Kind == taskevent.Restarting {
			t.Errorf("a restart after the trial's stop: %s", e.Message)
		}
	}
	if e := lastEvent(t, events); e.Kind != taskevent.TrialStopped {
		t.Errorf("last event %+v", e)
	}
}

// Another member's failure after the trial's stop (its leaving, seen by
// the group) ends this member too, without a restart.
func TestRemoteFailureAfterTheTrialsStopIsNoRestart(t *testing.T) {
	coord := newFakeCoord(2, nil)
	trial := newFakeTrial()
	go func() {
		<-coord.watched
		trial.request(ashaStop)
		coord.end(1, rendezvous.Failure{Member: "job.g[1]", Reason: "rank 3 exited 1", ExitCode: 1})
	}()
	code, events, _, _, _ := runTrial(t, context.Background(), coord, trial, 1, `exec sleep 60`)
	if code != 0 || coord.joins != 1 {
		t.Fatalf("code %d after %d joins; events:\n%s", code, coord.joins, messages(events))
	}
	if e := lastEvent(t, events); e.Kind != taskevent.TrialStopped {
		t.Errorf("last event %+v", e)
	}
}

// Nomad's stop of a trial whose stop was requested (the controller stops
// the trial's job too) still says why.
func TestNomadStopOfAStoppedTrialSaysWhy(t *testing.T) {
	for _, requested := range []bool{true, false} {
		t.Run("requested="+strconv.FormatBool(requested), func(t *testing.T) {
			coord := newFakeCoord(1, nil)
			trial := newFakeTrial()
			if requested {
				trial.request(ashaStop)
			}
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				<-coord.watched
				cancel()
			}()
			code, events, _, _, sup := runTrial(t, ctx, coord, trial, 1, `exec sleep 60`)
			e := lastEvent(t, events)
			switch {
			case requested && (code != 0 || e.Kind != taskevent.TrialStopped || !sup.TrialStopped()):
				t.Errorf("code %d, last event %+v; want 0 and trial_stopped", code, e)
			case !requested && (code != ExitStopped || e.Kind != taskevent.Stopped || sup.TrialStopped()):
				t.Errorf("code %d, last event %+v; want %d and stopped", code, e, ExitStopped)
			}
		})
	}
}

func TestRankZeroOutputGoesToTheTrialUnprefixed(t *testing.T) {
	coord := newFakeCoord(1, nil)
	trial := newFakeTrial()
	code, events, _, stdout, _ := runTrial(t, context.Background(), coord, trial, 2,
		`echo "gpujob-metric: {\"step\": 1, \"rank\": $RANK}"; printf 'gpujob-result: {"rank": %s}' $RANK`)
	if code != 0 {
		t.Fatalf("code %d; events:\n%s", code, messages(events))
	}
	want := []string{`gpujob-metric: {"step": 1, "rank": 0}`, `gpujob-result: {"rank": 0}`}
	if !reflect.DeepEqual(trial.lines, want) || trial.closes != 1 {
		t.Errorf("the trial read %q (closed %d times), want rank 0's lines %q", trial.lines, trial.closes, want)
	}
	// The task's stdout is what it was without the trial.
	for _, line := range []string{
		`[rank 0] gpujob-metric: {"step": 1, "rank": 0}`, `[rank 1] gpujob-metric: {"step": 1, "rank": 1}`,
		`[rank 0] gpujob-result: {"rank": 0}`, `[rank 1] gpujob-result: {"rank": 1}`,
	} {
		if !strings.Contains(stdout, line+"\n") {
			t.Errorf("stdout lacks %q:\n%s", line, stdout)
		}
	}
}

// A member that does not host rank 0 gives the record up and reads no
// output.
func TestTrialMemberWithoutRankZero(t *testing.T) {
	coord := newFakeCoord(1, nil)
	coord.rounds[0].RankOffset, coord.rounds[0].NodeRank, coord.rounds[0].WorldSize = 2, 1, 4
	trial := newFakeTrial()
	code, events, _, _, _ := runTrial(t, context.Background(), coord, trial, 2, `echo "gpujob-metric: {\"step\": 1, \"v\": 1}"`)
	if code != 0 {
		t.Fatalf("code %d; events:\n%s", code, messages(events))
	}
	if len(trial.lines) != 0 || !reflect.DeepEqual(trial.reporting, []bool{true, false}) {
		t.Errorf("lines %q, reporting %v; want none, and reporting turned off for the round", trial.lines, trial.reporting)
	}
}

func TestReportSpecValidate(t *testing.T) {
	for _, r := range []*ReportSpec{
		{MetricsKey: "", StopKey: "s"},
		{MetricsKey: "/a/m", StopKey: "a/s"},
		{MetricsKey: "a/m/", StopKey: "a/s"},
		{MetricsKey: "a//m", StopKey: "a/s"},
		{MetricsKey: "a/../m", StopKey: "a/s"},
		{MetricsKey: "a/m", StopKey: "a/m"},
	} {
		if err := r.validate(); err == nil {
			t.Errorf("%+v accepted", r)
		}
	}
	ok := &ReportSpec{MetricsKey: sweepkv.MetricsKey(sweepkv.DefaultPrefix, "ns", "s", "t1"), StopKey: sweepkv.StopKey(sweepkv.DefaultPrefix, "ns", "s", "t1")}
	if err := ok.validate(); err != nil {
		t.Error(err)
	}
}
