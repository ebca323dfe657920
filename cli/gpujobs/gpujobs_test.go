package gpujobs

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/gpujobs/fixture"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/taskevent"
)

// ev is the driver's task event for e.
func ev(e taskevent.Event) *api.TaskEvent { return fixture.DriverEvent(e, fixture.Epoch) }

func TestParseEvents(t *testing.T) {
	joined1 := fixture.Joined(1, 1, 4, 4, 7, 16, "10.0.0.5:24001")
	restart := func(e taskevent.Event, reason string, remote bool, member string) taskevent.Event {
		e.Kind, e.Remote = taskevent.Restarting, remote
		e.Failure = taskevent.Failure{Member: member, Reason: reason}
		return e
	}
	failedJoin := taskevent.Event{Kind: taskevent.Failed, MaxRestarts: 3, Failure: taskevent.Failure{
		Reason: "rendezvous default/bert round 1: join timed out after 5m0s: 1 of 2 members joined [bert.train[0]]; never joined: bert.train[1]"}}
	exhausted := restart(fixture.After(fixture.Joined(4, 0, 2, 0, 0, 2, "127.0.0.1:1"), 4, 3), "rank 0 exited 1", false, "bert.train[0]")
	tests := []struct {
		name   string
		events []*api.TaskEvent
		want   Progress
	}{
		{
			name: "none",
			want: Progress{NodeRank: -1, FirstRank: -1, LastRank: -1, MaxRestarts: -1},
		},
		{
			name: "single rank",
			events: []*api.TaskEvent{
				{Type: api.TaskReceived, DisplayMessage: "Task received by client"},
				ev(fixture.Joined(1, 0, 2, 0, 0, 2, "127.0.0.1:40469")),
			},
			want: Progress{Joined: true, Round: 1, NodeRank: 0, NNodes: 2, FirstRank: 0, LastRank: 0, WorldSize: 2,
				Master: "127.0.0.1:40469", MaxRestarts: 3,
				LastEvent: "joined round 1 as node 0 of 2 (rank 0 of 2, master 127.0.0.1:40469)"},
		},
		{
			name: "multi rank after restarts",
			events: []*api.TaskEvent{
				ev(joined1),
				ev(restart(joined1, "rank 5 exited 137", false, "bert.train[1]")),
				ev(fixture.After(joined1, 2, 1)),
				ev(restart(fixture.After(joined1, 2, 1), "rank 9 exited 1", true, "bert.train[2]")),
				ev(fixture.After(fixture.Joined(3, 1, 4, 4, 7, 16, "10.0.0.6:24001"), 3, 2)),
			},
			want: Progress{Joined: true, Round: 3, NodeRank: 1, NNodes: 4, FirstRank: 4, LastRank: 7, WorldSize: 16,
				Master: "10.0.0.6:24001", Restarts: 2, MaxRestarts: 3,
				LastEvent: "joined round 3 as node 1 of 4 (ranks 4-7 of 16, master 10.0.0.6:24001)"},
		},
		{
			name: "a restart spends one",
			events: []*api.TaskEvent{
				ev(fixture.After(fixture.Joined(2, 0, 2, 0, 0, 2, "127.0.0.1:1"), 2, 1)),
				ev(restart(fixture.After(fixture.Joined(2, 0, 2, 0, 0, 2, "127.0.0.1:1"), 2, 1), "rank 0 exited 137", false, "bert.train[0]")),
			},
			want: Progress{Joined: true, Round: 2, NodeRank: 0, NNodes: 2, FirstRank: 0, LastRank: 0, WorldSize: 2,
				Master: "127.0.0.1:1", Restarts: 2, MaxRestarts: 3,
				LastEvent: "rank 0 exited 137: restarting group, 1 of 3 restarts left"},
		},
		{
			name: "no restarts left",
			events: []*api.TaskEvent{
				ev(fixture.After(fixture.Joined(4, 0, 2, 0, 0, 2, "127.0.0.1:1"), 4, 3)),
				ev(exhausted),
				{Type: api.TaskTerminated, ExitCode: 1, DisplayMessage: "Exit Code: 1"},
			},
			want: Progress{Joined: true, Round: 4, NodeRank: 0, NNodes: 2, FirstRank: 0, LastRank: 0, WorldSize: 2,
				Master: "127.0.0.1:1", Restarts: 3, MaxRestarts: 3, LastEvent: "Exit Code: 1",
				Failure: exhausted.Describe()},
		},
		{
			name:   "join timeout",
			events: []*api.TaskEvent{ev(failedJoin)},
			want: Progress{NodeRank: -1, FirstRank: -1, LastRank: -1, MaxRestarts: 3,
				LastEvent: failedJoin.Describe(), Failure: failedJoin.Describe()},
		},
		{
			// Their text is shown; nothing is read from it.
			name: "a driver without details",
			events: []*api.TaskEvent{
				fixture.PlainDriverEvent("joined round 1 as node 0 of 2 (rank 0 of 2, master 127.0.0.1:1)", fixture.Epoch),
			},
			want: Progress{NodeRank: -1, FirstRank: -1, LastRank: -1, MaxRestarts: -1,
				LastEvent: "joined round 1 as node 0 of 2 (rank 0 of 2, master 127.0.0.1:1)"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ParseEvents(tt.events)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ParseEvents:\n got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestProgressRanks(t *testing.T) {
	e := fixture.Joined(3, 1, 4, 4, 7, 16, "10.0.0.5:24001")
	e.Message = e.Describe()
	p, ok := ParseJoined(e.Echo())
	if !ok {
		t.Fatalf("ParseJoined(%q): not parsed", e.Echo())
	}
	if got := p.Ranks(); !reflect.DeepEqual(got, []int{4, 5, 6, 7}) {
		t.Errorf("Ranks = %v", got)
	}
	if p.RanksText() != "4-7" || !p.HasRank(7) || p.HasRank(8) || p.HasRank(3) {
		t.Errorf("RanksText/HasRank wrong: %q", p.RanksText())
	}
	if _, ok := ParseJoined("gpujob: rank 0 exited 0"); ok {
		t.Error("ParseJoined accepted a non-join line")
	}
	var none Progress
	if none.HasRank(0) || none.RanksText() != "-" || none.Ranks() != nil {
		t.Error("an unjoined member has ranks")
	}
}

func TestParseLoss(t *testing.T) {
	gl := 0.693
	sps := 1650.2
	tests := []struct {
		line string
		want Loss
		ok   bool
	}{
		{"gpujob: step=40 epoch=0 rank=2 loss=0.6931 global_loss=0.6930 samples_per_sec=1650.2 lr=0.001000 world_size=4",
			Loss{Rank: 2, Step: 40, Loss: 0.6931, GlobalLoss: ptr(0.6930), SamplesPerSec: &sps}, true},
		{"[rank 5] gpujob: step=7 epoch=1 loss=1.5 global_loss=0.693",
			Loss{Rank: 5, Step: 7, Epoch: 1, Loss: 1.5, GlobalLoss: &gl}, true},
		{"gpujob: step=7 epoch=1 loss=abc", Loss{}, false},
		{"gpujob: resumed from checkpoint step=40 epoch=0 file=/x rank=0", Loss{}, false},
		{"step=40 loss=0.5", Loss{}, false},
		{"gpujob: step=3 epoch=0 rank=0", Loss{}, false},
	}
	for _, tt := range tests {
		got, ok := ParseLoss(tt.line)
		if ok != tt.ok || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ParseLoss(%q) = %+v, %v; want %+v, %v", tt.line, got, ok, tt.want, tt.ok)
		}
	}
}

func ptr[T any](v T) *T { return &v }

func TestParseResultAndPrefix(t *testing.T) {
	r, ok := ParseResult(`[rank 0] gpujob-result: {"accuracy": 0.94, "f1": 0.93, "wall_seconds": 12.3}`)
	if !ok || r["accuracy"] != 0.94 || r["f1"] != 0.93 {
		t.Fatalf("ParseResult = %v, %v", r, ok)
	}
	if _, ok := ParseResult("gpujob-result: {not json"); ok {
		t.Error("ParseResult accepted bad JSON")
	}
	for _, tt := range []struct {
		line string
		rank int
		rest string
		ok   bool
	}{
		{"[rank 12] hello", 12, "hello", true},
		{"[rank x] hello", 0, "[rank x] hello", false},
		{"[ranks 1-2] hello", 0, "[ranks 1-2] hello", false},
		{"hello", 0, "hello", false},
		{"[rank 3]", 3, "", true},
	} {
		r, rest, ok := SplitRankPrefix(tt.line)
		if r != tt.rank || rest != tt.rest || ok != tt.ok {
			t.Errorf("SplitRankPrefix(%q) = %d, %q, %v", tt.line, r, rest, ok)
		}
	}
}

func TestScan(t *testing.T) {
	text := strings.Join([]string{
		"[rank 1] gpujob: step=10 epoch=0 rank=1 loss=0.9",
		"[rank 0] gpujob: step=10 epoch=0 rank=0 loss=0.8",
		"[rank 1] gpujob: step=20 epoch=0 rank=1 loss=0.7",
		"[rank 0] noise",
		`[rank 0] gpujob-result: {"accuracy": 0.9}`,
	}, "\n")
	losses, result := Scan([]byte(text))
	if len(losses) != 2 || losses[0].Rank != 0 || losses[0].Loss != 0.8 || losses[1].Rank != 1 || losses[1].Step != 20 {
		t.Errorf("losses = %+v", losses)
	}
	if result["accuracy"] != 0.9 {
		t.Errorf("result = %v", result)
	}
}

func TestLineSplitter(t *testing.T) {
	var s LineSplitter
	var got []string
	for _, c := range []string{"a", "b\nc", "\r\n", "\n\nd"} {
		got = append(got, s.Write([]byte(c))...)
	}
	if l, ok := s.Flush(); ok {
		got = append(got, l)
	}
	if want := []string{"ab", "c", "", "", "d"}; !reflect.DeepEqual(got, want) {
		t.Errorf("lines = %q, want %q", got, want)
	}
	if _, ok := s.Flush(); ok {
		t.Error("second Flush returned a line")
	}
}

func stubAt(name, id, status string, version, create uint64) *api.AllocationListStub {
	return &api.AllocationListStub{ID: id, Name: name, ClientStatus: status, JobVersion: version, CreateIndex: create}
}

func TestSelectMembers(t *testing.T) {
	stubs := []*api.AllocationListStub{
		stubAt("j.train[1]", "b-old", "failed", 1, 10),
		stubAt("j.train[1]", "b-new", "running", 1, 20),
		stubAt("j.train[0]", "a", "complete", 1, 5),
		stubAt("j.train[2]", "c-v0", "complete", 0, 1), // an older version's, done
		stubAt("j.train[3]", "d-v0", "running", 0, 2),  // older version, still running
		stubAt("j.train[10]", "k", "pending", 1, 30),
	}
	var ids []string
	for _, m := range SelectMembers(stubs, 1, "train") {
		ids = append(ids, m.ID())
	}
	if want := []string{"a", "b-new", "d-v0", "k"}; !reflect.DeepEqual(ids, want) {
		t.Errorf("members = %v, want %v", ids, want)
	}
	// a stopped job is a new version without allocations: the last
	// version's members still show
	ids = nil
	for _, m := range SelectMembers(stubs, 2, "train") {
		ids = append(ids, m.ID())
	}
	if want := []string{"a", "b-new", "d-v0", "k"}; !reflect.DeepEqual(ids, want) {
		t.Errorf("members after a stop = %v, want %v", ids, want)
	}
}

func TestHelpers(t *testing.T) {
	if got := ShortUUID("GPU-5b8a1c3e-1111-2222-3333-444455556666"); got != "GPU-5b8a1c3e" {
		t.Errorf("ShortUUID = %q", got)
	}
	if got := ShortUUID("abc"); got != "abc" {
		t.Errorf("ShortUUID = %q", got)
	}
	now := time.Date(2025, 1, 2, 0, 0, 0, 0, time.UTC)
	for d, want := range map[time.Duration]string{0: "just now", 30 * time.Second: "30s ago", 5 * time.Minute: "5m ago",
		3 * time.Hour: "3h ago", 72 * time.Hour: "3d ago"} {
		if got := Ago(now, now.Add(-d)); got != want {
			t.Errorf("Ago(%v) = %q, want %q", d, got, want)
		}
	}
	if AllocIndex("bert.train[12]") != 12 || AllocIndex("x") != -1 {
		t.Error("AllocIndex")
	}
	for _, tt := range []struct {
		stop    bool
		c       Counts
		workers int
		want    string
	}{
		{true, Counts{Running: 2}, 2, "stopped"},
		{false, Counts{Running: 1, Failed: 1}, 2, "running"},
		{false, Counts{Complete: 2}, 2, "complete"},
		{false, Counts{Complete: 1, Failed: 1}, 2, "failed"},
		{false, Counts{}, 2, "pending"},
		{false, Counts{Pending: 1, Complete: 1}, 2, "pending"},
	} {
		if got := JobState(tt.stop, tt.c, tt.workers); got != tt.want {
			t.Errorf("JobState(%v, %+v) = %q, want %q", tt.stop, tt.c, got, tt.want)
		}
	}
	if got := (Counts{Running: 2, Failed: 1}).Text(); got != "2 running, 1 failed" {
		t.Errorf("Counts.Text = %q", got)
	}
}

func TestIsNotFoundAndLoadJob(t *testing.T) {
	f := nomadapi.NewFake()
	_, err := LoadJob(f, "nope")
	if err == nil || err.Error() != `job "nope" not found` {
		t.Errorf("LoadJob(missing) = %v", err)
	}
	id, name := "web", "web"
	f.SetJob(&api.Job{ID: &id, Name: &name})
	if _, err := LoadJob(f, "web"); err == nil || !strings.Contains(err.Error(), "not a gpujob training job") {
		t.Errorf("LoadJob(non-gpujob) = %v", err)
	}
	boom := errors.New("reading job x: cannot reach Nomad at http://127.0.0.1:4646 (is the agent running?)")
	f.Fail("Job", boom)
	if _, err := LoadJob(f, "x"); !errors.Is(err, boom) {
		t.Errorf("LoadJob passes errors through: %v", err)
	}
	if IsNotFound(nil) || IsNotFound(boom) {
		t.Error("IsNotFound")
	}
}

func TestReadLogKeepsTheTail(t *testing.T) {
	f := nomadapi.NewFake()
	alloc := &api.Allocation{ID: "a1", Name: "j.train[0]"}
	var chunks []string
	for i := range 1000 {
		chunks = append(chunks, fmt.Sprintf("line %04d\n", i)) // 10 bytes each
	}
	f.SetLog("a1", "train", "stdout", chunks...)
	b, err := ReadLog(context.Background(), f, alloc, "train", "stdout", 95)
	if err != nil {
		t.Fatal(err)
	}
	// 95 bytes → the partial first line is dropped: 9 whole lines
	if want := strings.Join(chunks[991:], ""); string(b) != want {
		t.Errorf("tail = %q, want %q", b, want)
	}
	all, err := ReadLog(context.Background(), f, alloc, "train", "stdout", 0)
	if err != nil || len(all) != 10000 {
		t.Errorf("whole log: %d bytes, %v", len(all), err)
	}
	f.SetLogError("a2", "train", "stdout", errors.New(`Unexpected response code: 404 (task "train" not started yet. No logs available)`))
	if _, err := ReadLog(context.Background(), f, &api.Allocation{ID: "a2", Name: "j.train[1]"}, "train", "stdout", 0); err == nil ||
		!strings.Contains(err.Error(), "not started yet") || !strings.Contains(err.Error(), "j.train[1]") {
		t.Errorf("ReadLog error = %v", err)
	}
}

// A task the driver refused to start fails with its error as gRPC carried it
// across the plugin boundary: the member's failure is the plain words.
func TestDriverFailureLosesItsRPCWrapping(t *testing.T) {
	reason := `the task would run as root (user "root", the task's user), which the gpujob driver refuses: set allow_root = true`
	e := &api.TaskEvent{Type: api.TaskDriverFailure, DisplayMessage: "rpc error: code = Unknown desc = " + reason,
		DriverError: "rpc error: code = Unknown desc = " + reason}
	if got := EventText(e); got != reason {
		t.Fatalf("EventText = %q, want %q", got, reason)
	}
	if p := ParseEvents([]*api.TaskEvent{e}); p.Failure != reason {
		t.Fatalf("failure %q, want %q", p.Failure, reason)
	}
	// A message that merely mentions rpc keeps every word.
	plain := &api.TaskEvent{Type: api.TaskDriverFailure, DisplayMessage: "the rpc error: code = x was here"}
	if got := EventText(plain); got != plain.DisplayMessage {
		t.Fatalf("EventText = %q", got)
	}
}

func TestTaskName(t *testing.T) {
	withTasks := func(meta map[string]string, tasks ...*api.Task) *api.Job {
		job := fixture.TrainJob("j", 2, 1)
		job.TaskGroups[0].Tasks = tasks
		for k, v := range meta {
			job.Meta[k] = v
		}
		return job
	}
	// An image job: a gpujob-driver sidecar and the docker member task.
	sidecar, member := api.NewTask("gpujob", "gpujob"), api.NewTask("train", "docker")
	for _, c := range []struct {
		name string
		job  *api.Job
		want string
	}{
		{"nil job", nil, "train"},
		{"rendered before gpujob_task: the gpujob task", fixture.TrainJob("j", 2, 1), "train"},
		{"rendered before gpujob_task, task renamed", withTasks(nil, api.NewTask("work", "gpujob")), "work"},
		{"image job: the meta names the docker task, not the sidecar", withTasks(map[string]string{contract.MetaTask: "train"}, sidecar, member), "train"},
		{"image job whose tasks are in the other order", withTasks(map[string]string{contract.MetaTask: "train"}, member, sidecar), "train"},
		{"the meta wins over the driver", withTasks(map[string]string{contract.MetaTask: "main"}, api.NewTask("helper", "gpujob"), api.NewTask("main", "docker")), "main"},
		{"a meta naming no task falls back", withTasks(map[string]string{contract.MetaTask: "gone"}, api.NewTask("work", "gpujob")), "work"},
		{"a job without groups takes the meta", &api.Job{Meta: map[string]string{contract.MetaTask: "train"}}, "train"},
		{"no meta, no gpujob task", withTasks(nil, api.NewTask("x", "docker")), "train"},
	} {
		if got := TaskName(c.job); got != c.want {
			t.Errorf("%s: TaskName = %q, want %q", c.name, got, c.want)
		}
	}
}

// TestNamesMatchRender: the names this package reads are those render writes.
func TestNamesMatchRender(t *testing.T) {
	for _, c := range [][2]string{
		{contract.MetaKind, contract.MetaKind}, {contract.KindTrain, contract.KindTrain}, {contract.MetaWorkers, contract.MetaWorkers},
		{contract.MetaGPUsPerWorker, contract.MetaGPUsPerWorker}, {contract.MetaTask, contract.MetaTask}, {contract.DriverName, render.Driver},
		{DefaultTask, render.Task}, {contract.GPUDevice, render.Device},
	} {
		if c[0] != c[1] {
			t.Errorf("gpujobs has %q where render has %q", c[0], c[1])
		}
	}
}
