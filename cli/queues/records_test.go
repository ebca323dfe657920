package queues

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/queue/admit"
)

// nomadBin finds the Nomad binary the way scripts/lib.sh does:
// NOMAD_BIN, else the cached build of the pinned version.
func nomadBin() string {
	if b := os.Getenv("NOMAD_BIN"); b != "" {
		return b
	}
	cache := os.Getenv("GPUJOB_CACHE_DIR")
	if cache == "" {
		base := os.Getenv("XDG_CACHE_HOME")
		if base == "" {
			home, _ := os.UserHomeDir()
			base = filepath.Join(home, ".cache")
		}
		cache = filepath.Join(base, "gpujob")
	}
	return filepath.Join(cache, "nomad-1.6.3", "nomad")
}

// parseJob is Nomad's own HCL2 parser (`nomad job run -output`, which
// parses locally: no agent), so a record holds the job submit would
// register.
func parseJob(t *testing.T, src []byte) *api.Job {
	t.Helper()
	p := filepath.Join(t.TempDir(), "job.nomad.hcl")
	if err := os.WriteFile(p, src, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(nomadBin(), "job", "run", "-output", p)
	cmd.Env = append(os.Environ(), "NOMAD_ADDR=http://127.0.0.1:1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s job run -output (make deps builds it): %v\n%s", nomadBin(), err, src)
	}
	var wrapped struct{ Job *api.Job }
	if err := json.Unmarshal(out, &wrapped); err != nil || wrapped.Job == nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return wrapped.Job
}

// Every example spec submit or service deploy renders becomes a record
// the admission controller accepts as is: the members and per-member
// resources Enqueue counts are the controller's, and the job survives
// the round trip through the stored JSON.
func TestRecordOfEveryExampleIsAccepted(t *testing.T) {
	paths, _ := filepath.Glob("../../jobspecs/examples/*.hcl")
	seen := 0
	for _, p := range paths {
		if strings.HasSuffix(p, ".nomad.hcl") || strings.Contains(filepath.Base(p), "sweep") {
			continue // plain Nomad jobspecs; sweeps do not go through the queue yet
		}
		t.Run(filepath.Base(p), func(t *testing.T) {
			var job *api.Job
			o := EnqueueOptions{Namespace: "team-a", Queue: "team-a", SubmittedBy: "alice", Now: now}
			if tr, _, diags := spec.Load(p, spec.Options{}); !diags.HasErrors() {
				tr.Queue = "team-a"
				src, err := render.Options{}.Jobspec(tr)
				if err != nil {
					t.Fatal(err)
				}
				job = parseJob(t, src)
				job.Meta[contract.MetaRun] = "1764676800"
				o.Kind, o.Priority = admit.KindTrain, SpecPriority(tr.Priority)
				defer func() {
					if got := o.Job.TaskGroups[0]; *got.Count != tr.Workers {
						t.Errorf("count %d, workers %d", *got.Count, tr.Workers)
					}
				}()
			} else {
				s, _, diags := spec.LoadService(p, spec.Options{})
				if diags.HasErrors() {
					t.Fatalf("neither a train nor a service spec: %v", diags)
				}
				s.Queue = "team-a"
				src, err := render.ServiceOptions{Namespace: "team-a"}.ServiceJobspec(s)
				if err != nil {
					t.Fatal(err)
				}
				job = parseJob(t, src)
				for _, g := range job.TaskGroups {
					g.Scaling = nil // as deploy queues it
				}
				o.Kind, o.Priority = admit.KindService, SpecPriority(s.Priority)
			}
			o.Job = job
			rec, err := o.Record()
			if err != nil {
				t.Fatal(err)
			}
			b, err := admit.EncodeJobRecord(rec, now)
			if pool := job.NodePool; pool != nil && *pool != "" && *pool != "default" {
				// Queued jobs run in the default pool for now: submit
				// refuses before writing, saying so.
				if err == nil || !strings.Contains(err.Error(), "node_pool") {
					t.Fatalf("a job in node pool %q: %v, want a refusal naming node_pool", *pool, err)
				}
				seen++
				return
			}
			if err != nil {
				t.Fatalf("the controller would refuse the record: %v", err)
			}
			back, backJob, err := admit.DecodeJobRecord(b, now)
			if err != nil {
				t.Fatalf("decoding: %v", err)
			}
			if back.Members != rec.Members || back.PerMember != rec.PerMember || back.Queue != "team-a" || back.Namespace != "team-a" ||
				*backJob.ID != *job.ID || *backJob.Namespace != "team-a" {
				t.Errorf("round trip: %+v, job %s/%s", back, *backJob.Namespace, *backJob.ID)
			}
			if rec.Members < 1 || (rec.Kind == admit.KindTrain && rec.PerMember.CPUMHz == 0) {
				t.Errorf("counted %d members of %+v", rec.Members, rec.PerMember)
			}
			seen++
		})
	}
	if seen < 6 {
		t.Errorf("%d example specs checked; want the 4 train and 2 service examples", seen)
	}
}

// testJob is a small rendered-like job: 2 members of 1 GPU each.
func testJob(id string) *api.Job {
	count, cpu, mem, gpus := 2, 1000, 2048, uint64(1)
	typ := "batch"
	return &api.Job{ID: &id, Name: &id, Type: &typ,
		Meta: map[string]string{contract.MetaKind: contract.KindTrain, contract.MetaQueue: "team-a"},
		TaskGroups: []*api.TaskGroup{{Name: strp("train"), Count: &count, Tasks: []*api.Task{{Name: "train", Driver: "gpujob",
			Resources: &api.Resources{CPU: &cpu, MemoryMB: &mem, Devices: []*api.RequestedDevice{{Name: "nvidia/gpu", Count: &gpus}}}}}}}}
}

func strp(s string) *string { return &s }

func records(t *testing.T) Records {
	t.Helper()
	r := Records{Consul: shared.Client(t), Prefix: "test/" + strings.ReplaceAll(t.Name(), "/", "-")}
	// The tree is the test's own, but not its run's: with -count=N a run
	// would find the last one's records.
	if _, err := r.Consul.KV().DeleteTree(r.Prefix+"/", nil); err != nil {
		t.Fatal(err)
	}
	return r
}

func enqueue(t *testing.T, r Records, id string) *Entry {
	t.Helper()
	e, err := r.Enqueue(context.Background(), EnqueueOptions{Job: testJob(id), Namespace: "ns1", Queue: "team-a",
		Kind: admit.KindTrain, SubmittedBy: "alice", Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// putStatus writes a status as the controller would.
func putStatus(t *testing.T, r Records, e *Entry, st admit.Status) {
	t.Helper()
	st.Format, st.RecordIndex = admit.Format, e.RecordIndex
	b, err := admit.EncodeStatus(&st)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Consul.KV().Put(&consulapi.KVPair{Key: admit.JobKey(r.StatusPrefix(), e.Record.Namespace, e.Record.ID), Value: b}, nil); err != nil {
		t.Fatal(err)
	}
}

// A job is queued once: a second submission of the name is refused with
// the first one's state and who submitted it, and changes nothing; a
// record of an ended job (admitted, no live Nomad job) is replaced.
func TestEnqueueIsCreateOnly(t *testing.T) {
	r := records(t)
	ctx := context.Background()
	e := enqueue(t, r, "bert")
	if e.RecordIndex == 0 || e.State() != StateWaiting || e.Record.Members != 2 || e.Record.PerMember != (admit.Resources{GPUs: 1, CPUMHz: 1000, MemoryMB: 2048}) {
		t.Fatalf("entry %+v, record %+v", e, e.Record)
	}
	_, err := r.Enqueue(ctx, EnqueueOptions{Job: testJob("bert"), Namespace: "ns1", Queue: "team-a", Kind: admit.KindTrain, SubmittedBy: "bob", Now: now.Add(time.Minute)})
	var aq *AlreadyQueuedError
	if !errors.As(err, &aq) || !strings.Contains(err.Error(), "job bert is already in queue team-a (waiting, submitted by alice") ||
		!strings.Contains(err.Error(), "gpujob stop bert") {
		t.Fatalf("err %v", err)
	}
	cur, _ := r.Get(ctx, "ns1", "bert")
	if cur.RecordIndex != e.RecordIndex || cur.Record.SubmittedBy != "alice" {
		t.Errorf("the first record changed: %+v", cur.Record)
	}
	// Queued (not admitted): NoLiveJob does not replace it.
	putStatus(t, r, e, admit.Status{State: admit.StateQueued, Position: 1})
	if _, err := r.Enqueue(ctx, EnqueueOptions{Job: testJob("bert"), Namespace: "ns1", Queue: "team-a", Kind: admit.KindTrain, SubmittedBy: "bob", Now: now, NoLiveJob: true}); !errors.As(err, &aq) {
		t.Fatalf("a queued record was replaced: %v", err)
	}
	at := now
	putStatus(t, r, e, admit.Status{State: admit.StateAdmitted, Admissions: 1, AdmittedAt: &at})
	e2, err := r.Enqueue(ctx, EnqueueOptions{Job: testJob("bert"), Namespace: "ns1", Queue: "team-a", Kind: admit.KindTrain, SubmittedBy: "bob", Now: now, NoLiveJob: true})
	if err != nil || e2.RecordIndex == e.RecordIndex || e2.Record.SubmittedBy != "bob" || e2.Status != nil {
		t.Fatalf("an ended job's record was not replaced: %v %+v", err, e2)
	}
	// A record whose numbers would lie is never written.
	bad := testJob("liar")
	bad.Meta[contract.MetaAdmission] = "1.1"
	if _, err := r.Enqueue(ctx, EnqueueOptions{Job: bad, Namespace: "ns1", Queue: "team-a", Kind: admit.KindTrain, SubmittedBy: "x", Now: now}); err == nil {
		t.Error("a job carrying the controller's marker was queued")
	}
}

// lineWriter hands each line written to a channel.
type lineWriter struct{ lines chan string }

func (w lineWriter) Write(p []byte) (int, error) {
	sc := bufio.NewScanner(strings.NewReader(string(p)))
	for sc.Scan() {
		w.lines <- sc.Text()
	}
	return len(p), nil
}

func next(t *testing.T, lines chan string, want string) {
	t.Helper()
	select {
	case l := <-lines:
		if !strings.Contains(l, want) {
			t.Fatalf("line %q, want %q", l, want)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("no line saying %q", want)
	}
}

// AwaitAdmission prints each change of the job's place (waiting for the
// controller, queued with position, reason and estimate, closer) and
// returns once the controller admits it; each step is written only after
// the previous line was seen, so none is lost to a fast writer.
func TestAwaitAdmission(t *testing.T) {
	r := records(t)
	e := enqueue(t, r, "bert")
	lines := make(chan string, 16)
	type result struct {
		e   *Entry
		err error
	}
	done := make(chan result, 1)
	go func() {
		got, err := r.AwaitAdmission(context.Background(), e, AwaitOptions{Out: lineWriter{lines}, Now: func() time.Time { return now }})
		done <- result{got, err}
	}()
	next(t, lines, "queued in team-a: waiting for the admission controller's first answer")
	est := now.Add(10 * time.Minute)
	putStatus(t, r, e, admit.Status{State: admit.StateQueued, Position: 2, Reason: "1 job ahead; team-a uses 8 of its 8 GPUs; borrowing off", EstimatedStart: &est})
	next(t, lines, "queued in team-a (position 2): 1 job ahead; team-a uses 8 of its 8 GPUs; borrowing off, estimated start 12:10:00 UTC (in 10m0s)")
	putStatus(t, r, e, admit.Status{State: admit.StateQueued, Position: 1, Reason: "waiting for 2 GPUs"})
	next(t, lines, "queued in team-a (position 1): waiting for 2 GPUs, no estimated start yet")
	at := now.Add(time.Minute)
	putStatus(t, r, e, admit.Status{State: admit.StateAdmitted, Admissions: 1, AdmittedAt: &at, Placement: []admit.Placement{{Node: "gpu-1", Members: 2}}})
	next(t, lines, "admitted by queue team-a at 2026-12-02T12:01:00Z")
	res := <-done
	if res.err != nil || res.e.State() != admit.StateAdmitted {
		t.Fatalf("%v %+v", res.err, res.e)
	}
}

// A refusal ends the wait with the controller's reason; a withdrawn record
// with ErrWithdrawn; a cancelled context leaves the job queued.
func TestAwaitAdmissionEnds(t *testing.T) {
	r := records(t)
	ctx := context.Background()
	e := enqueue(t, r, "refused")
	putStatus(t, r, e, admit.Status{State: admit.StateRefused, Reason: `unknown queue "team-a"`})
	_, err := r.AwaitAdmission(ctx, e, AwaitOptions{Out: io.Discard})
	var refused *RefusedError
	if !errors.As(err, &refused) || !strings.Contains(err.Error(), `refused by queue team-a: unknown queue "team-a" (gpujob stop refused withdraws it)`) {
		t.Fatalf("err %v", err)
	}

	e = enqueue(t, r, "gone")
	lines := make(chan string, 16)
	done := make(chan error, 1)
	go func() {
		_, err := r.AwaitAdmission(ctx, e, AwaitOptions{Out: lineWriter{lines}})
		done <- err
	}()
	next(t, lines, "waiting for the admission controller")
	if ok, err := r.Withdraw(ctx, e); !ok || err != nil {
		t.Fatal(ok, err)
	}
	// The controller deletes the status of a withdrawn record; the wait
	// wakes on that.
	putStatus(t, r, e, admit.Status{State: admit.StateQueued, Position: 1})
	if _, err := r.Consul.KV().Delete(admit.JobKey(r.StatusPrefix(), "ns1", "gone"), nil); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrWithdrawn) {
		t.Fatalf("err %v", err)
	}

	e = enqueue(t, r, "cancelled")
	cctx, cancel := context.WithCancel(ctx)
	// Lines of its own: the first wait may have printed the queued status
	// before it saw the deletion.
	lines = make(chan string, 16)
	go func() {
		_, err := r.AwaitAdmission(cctx, e, AwaitOptions{Out: lineWriter{lines}})
		done <- err
	}()
	next(t, lines, "waiting for the admission controller")
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
	if cur, _ := r.Get(ctx, "ns1", "cancelled"); cur == nil {
		t.Error("a cancelled wait withdrew the job")
	}
}

// Each state in a sentence and in the -json fields.
func TestEntryRendering(t *testing.T) {
	est, at := now.Add(90*time.Second), now.Add(-time.Hour)
	rec := &admit.JobRecord{ID: "bert", Namespace: "ns1", Queue: "team-a", Kind: admit.KindTrain, Members: 2,
		PerMember: admit.Resources{GPUs: 4}, SubmittedAt: now.Add(-2 * time.Hour), SubmittedBy: "alice"}
	for _, tc := range []struct {
		name string
		st   *admit.Status
		want string
		json map[string]any
	}{
		{"waiting", nil, "queued in team-a: waiting for the admission controller's first answer (submitted 2026-12-02T10:00:00Z by alice)",
			map[string]any{"state": "waiting", "gpus": 8.0}},
		{"queued", &admit.Status{State: admit.StateQueued, Position: 3, Reason: "2 jobs ahead", EstimatedStart: &est},
			"queued in team-a (position 3): 2 jobs ahead, estimated start 12:01:30 UTC (in 1m30s)",
			map[string]any{"state": "queued", "position": 3.0, "reason": "2 jobs ahead", "estimated_start": "2026-12-02T12:01:30Z"}},
		{"requeued", &admit.Status{State: admit.StateQueued, Position: 1, Preemptions: 1, PreemptedBy: "ns1/big", PreemptedWhy: "priority 90 over 50"},
			"queued in team-a (position 1), no estimated start yet (running jobs without a max_runtime hold what it needs); preempted 1 time(s), last by ns1/big: priority 90 over 50",
			map[string]any{"preempted_by": "ns1/big", "preemptions": 1.0}},
		{"admitted", &admit.Status{State: admit.StateAdmitted, Admissions: 1, AdmittedAt: &at, Reason: "backfilled: it ends before the first job waiting"},
			"admitted by queue team-a at 2026-12-02T11:00:00Z (backfilled: it ends before the first job waiting)",
			map[string]any{"state": "admitted", "admitted_at": "2026-12-02T11:00:00Z", "admissions": 1.0}},
		{"preempted", &admit.Status{State: admit.StatePreempted, Admissions: 1, AdmittedAt: &at, PreemptedBy: "ns2/serve", PreemptedWhy: "queue team-b reclaims its quota", PreemptedAt: &now, Preemptions: 1},
			"preempted by ns2/serve: queue team-b reclaims its quota; it stops and is queued again in team-a at its old place",
			map[string]any{"state": "preempted", "preempted_why": "queue team-b reclaims its quota"}},
		{"refused", &admit.Status{State: admit.StateRefused, Reason: "job bert needs 8 GPUs; queue team-a's quota is 4 GPUs and borrowing is off"},
			"refused by queue team-a: job bert needs 8 GPUs; queue team-a's quota is 4 GPUs and borrowing is off (gpujob stop bert withdraws it)",
			map[string]any{"state": "refused"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &Entry{Record: rec, RecordIndex: 7, Status: tc.st}
			if got := e.Line(now); got != tc.want {
				t.Errorf("line\n%s\nwant\n%s", got, tc.want)
			}
			b, _ := json.Marshal(e.Info())
			var m map[string]any
			_ = json.Unmarshal(b, &m)
			for k, v := range tc.json {
				if !reflect.DeepEqual(m[k], v) {
					t.Errorf("json %s = %v, want %v (%s)", k, m[k], v, b)
				}
			}
			if m["queue"] != "team-a" || m["submitted_by"] != "alice" {
				t.Errorf("json %s", b)
			}
		})
	}
}

// Stopping a queued job withdraws its record (a check-and-set: one
// resubmitted meanwhile stays) and says so; the listing then lacks it.
func TestCancelAQueuedJob(t *testing.T) {
	r := records(t)
	ctx := context.Background()
	e := enqueue(t, r, "bert")
	putStatus(t, r, e, admit.Status{State: admit.StateQueued, Position: 2, Reason: "1 job ahead"})
	e, _ = r.Get(ctx, "ns1", "bert")
	other := enqueue(t, r, "other")
	var out strings.Builder
	if ok, err := r.Cancel(ctx, e, &out); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if out.String() != "Job bert withdrawn from queue team-a (it was queued at position 2; nothing of it ran).\n" {
		t.Errorf("said %q", out.String())
	}
	if cur, _ := r.Get(ctx, "ns1", "bert"); cur != nil {
		t.Errorf("the record stays: %+v", cur)
	}
	l, err := r.List(ctx, "")
	if err != nil || len(l) != 1 || l[0].Record.ID != "other" {
		t.Fatalf("list %v %v", l, err)
	}
	// A record replaced since it was read is not withdrawn.
	if _, err := r.Withdraw(ctx, other); err != nil {
		t.Fatal(err)
	}
	again := enqueue(t, r, "other")
	if ok, err := r.Cancel(ctx, other, io.Discard); ok || err == nil {
		t.Errorf("a resubmitted record was withdrawn through the old one: %v %v", ok, err)
	}
	if cur, _ := r.Get(ctx, "ns1", "other"); cur == nil || cur.RecordIndex != again.RecordIndex {
		t.Errorf("the resubmitted record is gone")
	}
}

// queue status lists each queue's queued jobs, next first, with their
// sentences.
func TestStatusListsQueuedJobs(t *testing.T) {
	r := records(t)
	ctx := context.Background()
	a, b := enqueue(t, r, "a"), enqueue(t, r, "b")
	putStatus(t, r, a, admit.Status{State: admit.StateQueued, Position: 2, Reason: "1 job ahead"})
	putStatus(t, r, b, admit.Status{State: admit.StateQueued, Position: 1, Reason: "waiting for 2 GPUs"})
	entries, err := r.List(ctx, "ns1")
	if err != nil || len(entries) != 2 || entries[0].Record.ID != "b" {
		t.Fatalf("%v %v", entries, err)
	}
	st := &Status{Queues: []QueueStatus{{Queue: DefaultQueue, Configured: true}}}
	st.AddQueued(entries, "", now)
	var out strings.Builder
	if err := st.Print(&out, false); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Queued in team-a (next first):", "1    b    ns1", "2    a    ns1",
		"  b: queued in team-a (position 1): waiting for 2 GPUs"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	b2, _ := json.Marshal(st)
	if !strings.Contains(string(b2), `"queued":[{"namespace":"ns1","job_id":"b","kind":"train","members":2,"queue":"team-a","state":"queued","position":1`) {
		t.Errorf("json %s", b2)
	}
}
