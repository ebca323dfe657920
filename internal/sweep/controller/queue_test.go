package controller

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	nomad "github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/queue/admit"
	"github.com/gpujob/gpujob/internal/queue/queuekv"
)

// queueLauncherT is the fake cluster's launcher with the trial jobs
// rendered as sweepjob's are: 2 members of 2 GPUs each, queue
// "research", priority 70.
type queueLauncherT struct{ *launcher }

func (l queueLauncherT) TrialJob(t Trial) (*nomad.Job, error) {
	id, typ, count, prio, cpu, mem, gpus := t.JobID, "batch", 2, 70, 1000, 2048, uint64(2)
	return &nomad.Job{
		ID: &id, Name: &id, Type: &typ, Priority: &prio,
		Meta: map[string]string{contract.MetaKind: contract.KindTrain, contract.MetaQueue: "research", contract.MetaRun: "run-1"},
		TaskGroups: []*nomad.TaskGroup{{Name: strPtr("train"), Count: &count, Tasks: []*nomad.Task{{
			Name: "train", Driver: "gpujob",
			Resources: &nomad.Resources{CPU: &cpu, MemoryMB: &mem, Devices: []*nomad.RequestedDevice{{Name: "nvidia/gpu", Count: &gpus}}},
		}}}},
	}, nil
}

func strPtr(s string) *string { return &s }

func queuePrefixOf(t *testing.T) string { return testPrefix(t) + "/queues" }

// applyQueues writes a queue configuration, as gpujob queue apply does.
func applyQueues(t *testing.T) {
	t.Helper()
	rec := &queuekv.Record{Format: queuekv.Format, Queues: []queuekv.Queue{{Name: "research", GPUs: 8, Weight: 1, Priority: 50}},
		File: "queues.hcl", SHA256: strings.Repeat("ab", 32), AppliedBy: "admin@desk", AppliedAt: time.Now().UTC()}
	if _, err := queuekv.New(needConsul(t), queuePrefixOf(t)).Write(context.Background(), rec, 0); err != nil {
		t.Fatal(err)
	}
}

// queueRecords reads the queue's job records of namespace default.
func queueRecords(t *testing.T) map[string]*api.KVPair {
	t.Helper()
	pairs, _, err := needConsul(t).KV().List(queuePrefixOf(t)+"/jobs/default/", nil)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*api.KVPair{}
	for _, p := range pairs {
		out[strings.TrimPrefix(p.Key, queuePrefixOf(t)+"/jobs/default/")] = p
	}
	return out
}

// writeStatus writes a job's status, as the admission controller does.
func writeStatus(t *testing.T, rec *api.KVPair, s admit.Status) {
	t.Helper()
	s.Format, s.RecordIndex = admit.Format, rec.CreateIndex
	b, err := admit.EncodeStatus(&s)
	if err != nil {
		t.Fatal(err)
	}
	key := strings.Replace(rec.Key, "/jobs/", "/state/status/", 1)
	if _, err := needConsul(t).KV().Put(&api.KVPair{Key: key, Value: b}, nil); err != nil {
		t.Fatal(err)
	}
}

func trialOf(st *State, id string) Trial {
	if t := st.Trial(id); t != nil {
		return *t
	}
	return Trial{}
}

// In queue mode the controller registers nothing: each trial becomes a
// record the admission controller accepts, counted against parallel while
// it waits; a refused trial fails with the queue's reason and its record
// goes; an admitted one runs as ever; stopping the sweep withdraws the
// records of the trials still queued.
func TestQueueModeQueuesTrials(t *testing.T) {
	cleanKV(t)
	applyQueues(t)
	f := newFakeCluster()
	p := basePlan()
	p.MaxTrials, p.Parallel, p.MaxFailedTrials, p.SubmittedBy = 4, 2, 1, "alice@desk"
	sup := startSupervisors(t, f, "sw", func(tr Trial) script {
		sc := rising(tr)
		sc.forever = tr.Index == 2
		return sc
	})
	sup.stubborn = func(tr Trial) bool { return tr.Index == 2 }
	c := newController(t, p, queueLauncherT{&launcher{f: f, who: "a"}}, "alloc-a")
	c.QueuePrefix = queuePrefixOf(t)
	ch := runAsync(context.Background(), c)

	waitFor(t, 10*time.Second, "two trials queued", func() bool {
		st := loadState(t)
		return len(queueRecords(t)) == 2 && st.Counts()[TrialRunning] == 2 &&
			strings.Contains(st.Trials[0].Waiting, "queued in research") && strings.Contains(st.Trials[1].Waiting, "queued in research")
	})
	st := loadState(t)
	if len(st.Trials) != 2 {
		t.Errorf("%d trials proposed while 2 are queued, parallel is 2", len(st.Trials))
	}
	recs := queueRecords(t)
	for _, tr := range st.Trials {
		p := recs[tr.JobID]
		if p == nil {
			t.Fatalf("no queue record of %s: %v", tr.JobID, recs)
		}
		rec, job, err := admit.DecodeJobRecord(p.Value, time.Now())
		if err != nil {
			t.Fatalf("%s: the admission controller would refuse its record: %v", tr.ID, err)
		}
		if rec.Kind != admit.KindTrial || rec.Queue != "research" || rec.Priority != 70 || rec.Members != 2 || rec.PerMember.GPUs != 2 ||
			!rec.SubmittedAt.Equal(tr.Created) || rec.SubmittedBy != "alice@desk" || rec.Namespace != "default" || *job.ID != tr.JobID {
			t.Errorf("%s: record %+v", tr.ID, rec)
		}
	}
	if !st.Trials[0].Created.Before(st.Trials[1].Created) && !st.Trials[0].Created.Equal(st.Trials[1].Created) {
		t.Errorf("trials created out of order: %v", st.Trials)
	}

	// The queue refuses the first: it fails with the reason, its record
	// goes, and the third trial is queued in its place.
	writeStatus(t, recs["sw-trial-001"], admit.Status{State: admit.StateRefused, Reason: "it asks for 4 GPUs, more than queue research's quota ever holds"})
	waitFor(t, 10*time.Second, "trial-001 failed, trial-003 queued", func() bool {
		st := loadState(t)
		r := queueRecords(t)
		return trialOf(st, "trial-001").State == TrialFailed && r["sw-trial-001"] == nil && r["sw-trial-003"] != nil
	})
	if tr := trialOf(loadState(t), "trial-001"); tr.Reason != "the queue refused it: it asks for 4 GPUs, more than queue research's quota ever holds" {
		t.Errorf("trial-001 failed with %q", tr.Reason)
	}

	// The queue admits the second: its job runs (the fake supervisors run
	// it) and completes.
	recs = queueRecords(t)
	writeStatus(t, recs["sw-trial-002"], admit.Status{State: admit.StateAdmitted, Admissions: 1, AdmittedAt: timePtr(time.Now().UTC())})
	waitFor(t, 5*time.Second, "trial-002 waits for Nomad", func() bool {
		return strings.Contains(trialOf(loadState(t), "trial-002").Waiting, "admitted by queue research")
	})
	f.admit(t, trialOf(loadState(t), "trial-002"))
	waitFor(t, 10*time.Second, "trial-002 completed", func() bool {
		return trialOf(loadState(t), "trial-002").State == TrialCompleted
	})

	// The third is admitted and runs (and ignores stop requests); the
	// fourth waits in the queue.
	waitFor(t, 10*time.Second, "trial-004 queued", func() bool {
		return queueRecords(t)["sw-trial-004"] != nil && trialOf(loadState(t), "trial-004").State == TrialRunning
	})
	writeStatus(t, queueRecords(t)["sw-trial-003"], admit.Status{State: admit.StateAdmitted, Admissions: 1, AdmittedAt: timePtr(time.Now().UTC())})
	f.admit(t, trialOf(loadState(t), "trial-003"))
	waitFor(t, 10*time.Second, "trial-003 reports", func() bool { return trialOf(loadState(t), "trial-003").Step > 0 })

	// Stopping the sweep withdraws the fourth, still queued, at once, and
	// the third's record, whose job is stopped after the grace.
	for {
		st, index, err := LoadState(context.Background(), needConsul(t), testPrefix(t), "default", "sw")
		if err != nil {
			t.Fatal(err)
		}
		st.StopRequested = true
		if ok, err := SaveState(context.Background(), needConsul(t), testPrefix(t), st, index); err != nil {
			t.Fatal(err)
		} else if ok {
			break
		}
	}
	if err := waitRun(t, ch, 10*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	st = loadState(t)
	for _, id := range []string{"trial-003", "trial-004"} {
		if tr := trialOf(st, id); tr.State != TrialStopped || st.Status != StatusStopped {
			t.Errorf("sweep %s, %s %+v", st.Status, id, tr)
		}
	}
	if stops := f.callsOf("stop", ""); len(stops) < 2 || f.phase("sw-trial-003") != JobStopped {
		t.Errorf("stop calls %v; job sw-trial-003 %s", stops, f.phase("sw-trial-003"))
	}
	if r := queueRecords(t); len(r) != 0 {
		t.Errorf("queue records left after the sweep: %v", r)
	}
	if n := len(f.callsOf("launch", "")); n != 0 {
		t.Errorf("the controller registered %d trial jobs itself in queue mode", n)
	}
	checkNoGoroutines(t)
	checkReleased(t)
}

// admit registers a trial's job as the admission controller does (the
// fake supervisors then run it).
func (f *fakeCluster) admit(t *testing.T, tr Trial) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.jobs[tr.JobID] != nil {
		t.Fatalf("job %s exists already", tr.JobID)
	}
	j := &fakeJob{id: tr.JobID, trial: tr, phase: JobQueued, created: time.Now()}
	f.jobs[tr.JobID] = j
	f.order = append(f.order, tr.JobID)
	f.bump()
	f.created <- j
}

// Without a queue configuration the controller registers its trials as
// it always did, and writes nothing into the queues' tree.
func TestWithoutQueuesTrialsAreRegistered(t *testing.T) {
	cleanKV(t)
	f := newFakeCluster()
	p := basePlan()
	p.MaxTrials, p.Parallel = 3, 2
	startSupervisors(t, f, "sw", rising)
	c := newController(t, p, queueLauncherT{&launcher{f: f, who: "a"}}, "alloc-a")
	c.QueuePrefix = queuePrefixOf(t)
	if err := waitRun(t, runAsync(context.Background(), c), 30*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	f.checkCreatedOnce(t, "sw", 3)
	if st := loadState(t); st.Status != StatusCompleted {
		t.Errorf("sweep %s: %s", st.Status, st.Reason)
	}
	keys, _, err := needConsul(t).KV().Keys(queuePrefixOf(t)+"/", "", nil)
	if err != nil || len(keys) != 0 {
		t.Errorf("keys under the queues' tree: %v %v", keys, err)
	}
}

// A queue record of the trial's job left by another submission of the
// sweep is not taken for this trial's: the trial fails, and the record
// is left to its owner.
func TestQueueModeRefusesAnotherSubmissionsRecord(t *testing.T) {
	cleanKV(t)
	applyQueues(t)
	f := newFakeCluster()
	p := basePlan()
	p.MaxTrials, p.Parallel, p.MaxFailedTrials = 1, 1, 0
	key := queuePrefixOf(t) + "/jobs/default/sw-trial-001"
	if _, err := needConsul(t).KV().Put(&api.KVPair{Key: key, Value: []byte(`{"submitted_at":"2020-01-01T00:00:00Z","job":{"Meta":{"gpujob_run":"old"}}}`)}, nil); err != nil {
		t.Fatal(err)
	}
	c := newController(t, p, queueLauncherT{&launcher{f: f, who: "a"}}, "alloc-a")
	c.QueuePrefix = queuePrefixOf(t)
	if err := waitRun(t, runAsync(context.Background(), c), 10*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	st := loadState(t)
	if tr := st.Trials[0]; tr.State != TrialFailed || !strings.Contains(tr.Reason, "a queued job sw-trial-001 of another submission") {
		t.Errorf("trial %+v", tr)
	}
	if p, _, err := needConsul(t).KV().Get(key, nil); err != nil || p == nil {
		t.Errorf("the other submission's record was removed: %v", err)
	}
}

// DeleteTrialRecords (stop and purge) removes the sweep's trials' records
// and nothing else: not a sweep's whose name extends this one's.
func TestDeleteTrialRecords(t *testing.T) {
	cleanKV(t)
	kv := needConsul(t).KV()
	for _, id := range []string{"sw-trial-001", "sw-trial-012", "sw-trial-x-trial-001", "swx-trial-001"} {
		if _, err := kv.Put(&api.KVPair{Key: queuePrefixOf(t) + "/jobs/default/" + id, Value: []byte("{}")}, nil); err != nil {
			t.Fatal(err)
		}
	}
	n, err := DeleteTrialRecords(context.Background(), needConsul(t), queuePrefixOf(t), "default", "sw")
	if err != nil || n != 2 {
		t.Fatalf("deleted %d: %v", n, err)
	}
	left := queueRecords(t)
	if len(left) != 2 || left["sw-trial-x-trial-001"] == nil || left["swx-trial-001"] == nil {
		t.Errorf("left %v", left)
	}
}
func timePtr(t time.Time) *time.Time { return &t }

// What a queued trial's job reads as, by its status: the queue's word
// until it admits the job, Nomad's after; a status of an earlier record of
// the same job, or one that does not decode, is no status.
func TestQueueModeObservations(t *testing.T) {
	cleanKV(t)
	f := newFakeCluster()
	p := basePlan()
	c := newController(t, p, queueLauncherT{&launcher{f: f, who: "a"}}, "alloc-a")
	c.QueuePrefix = queuePrefixOf(t)
	ctx := context.Background()
	now := time.Now().UTC()
	ql := &queueLauncher{c: c, inner: c.Launcher, queue: true, trials: map[string]Trial{}}
	var ids []string
	for i := range 7 {
		tr := Trial{ID: TrialID(i), Index: i, JobID: TrialJobID("sw", i), State: TrialPending, Created: now.Add(time.Duration(i) * time.Millisecond)}
		ql.trials[tr.JobID] = tr
		ids = append(ids, tr.JobID)
		if i == 5 {
			continue // never queued
		}
		if i == 6 {
			// Written by a user of the namespace, with an escape sequence
			// for a queue name: none of it reaches the state.
			v := fmt.Sprintf(`{"queue":"\u001b[2Jx","submitted_at":%q}`, tr.Created.Format(time.RFC3339Nano))
			if _, err := needConsul(t).KV().Put(&api.KVPair{Key: queuePrefixOf(t) + "/jobs/default/" + tr.JobID, Value: []byte(v)}, nil); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := ql.Launch(ctx, tr); err != nil {
			t.Fatal(err)
		}
	}
	if err := ql.Launch(ctx, ql.trials["sw-trial-001"]); err != nil {
		t.Errorf("launching a trial again: %v", err)
	}
	recs := queueRecords(t)
	writeStatus(t, recs["sw-trial-001"], admit.Status{State: admit.StateQueued, Position: 3, Reason: "queue research is at its quota"})
	writeStatus(t, recs["sw-trial-002"], admit.Status{State: admit.StatePreempted, Admissions: 1, PreemptedBy: "default/bert", PreemptedWhy: "reclaiming quota"})
	writeStatus(t, recs["sw-trial-003"], admit.Status{State: admit.StateAdmitted, Admissions: 1, AdmittedAt: timePtr(now)})
	writeStatus(t, recs["sw-trial-004"], admit.Status{State: admit.StateAdmitted, Admissions: 1, AdmittedAt: timePtr(now)})
	f.admit(t, ql.trials["sw-trial-004"])
	f.setPhase("sw-trial-004", JobRunning)
	// trial-005's status is of an earlier record of its job (another
	// record index): not believed.
	b, _ := admit.EncodeStatus(&admit.Status{Format: admit.Format, State: admit.StateRefused, RecordIndex: recs["sw-trial-005"].CreateIndex + 1000, Reason: "old"})
	if _, err := needConsul(t).KV().Put(&api.KVPair{Key: queuePrefixOf(t) + "/state/status/default/sw-trial-005", Value: b}, nil); err != nil {
		t.Fatal(err)
	}
	got, err := ql.Observe(ctx, ids)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]JobObservation{
		"sw-trial-001": {Phase: JobQueued, Reason: "waits in queue research (position 3): queue research is at its quota"},
		"sw-trial-002": {Phase: JobQueued, Reason: "preempted by default/bert (reclaiming quota); it queues again at its place in research once its members have stopped"},
		"sw-trial-003": {Phase: JobQueued, Reason: "admitted by queue research; Nomad has not registered it yet"},
		"sw-trial-004": {Phase: JobRunning},
		"sw-trial-005": {Phase: JobQueued, Reason: "queued in research; the admission controller has not placed it in the queue yet"},
		"sw-trial-006": {Phase: JobMissing},
		"sw-trial-007": {Phase: JobQueued, Reason: "queued in its queue; the admission controller has not placed it in the queue yet"},
	}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("%s: %+v, want %+v", id, got[id], w)
		}
	}
}

// The queue configuration removed while trials wait in the queue: the
// next trials are registered, the queued ones stay the queue's (a refusal
// still fails them with its reason) rather than read as vanished jobs.
func TestQueueModeEndsWithTheConfiguration(t *testing.T) {
	cleanKV(t)
	applyQueues(t)
	f := newFakeCluster()
	p := basePlan()
	p.MaxTrials, p.Parallel, p.MaxFailedTrials = 3, 2, 1
	startSupervisors(t, f, "sw", rising)
	c := newController(t, p, queueLauncherT{&launcher{f: f, who: "a"}}, "alloc-a")
	c.QueuePrefix = queuePrefixOf(t)
	ch := runAsync(context.Background(), c)
	waitFor(t, 10*time.Second, "two trials queued", func() bool {
		return len(queueRecords(t)) == 2 && loadState(t).Counts()[TrialRunning] == 2
	})
	if _, err := needConsul(t).KV().Delete(queuekv.ConfigKey(queuePrefixOf(t)), nil); err != nil {
		t.Fatal(err)
	}
	recs := queueRecords(t)
	writeStatus(t, recs["sw-trial-001"], admit.Status{State: admit.StateRefused, Reason: "queue research does not exist"})
	waitFor(t, 10*time.Second, "trial-001 failed, trial-003 registered", func() bool {
		return trialOf(loadState(t), "trial-001").State == TrialFailed && len(f.callsOf("launch", "")) == 1
	})
	if tr := trialOf(loadState(t), "trial-001"); tr.Reason != "the queue refused it: queue research does not exist" {
		t.Errorf("trial-001: %q", tr.Reason)
	}
	if calls := f.callsOf("launch", ""); calls[0].jobID != "sw-trial-003" {
		t.Errorf("registered %v", calls)
	}
	if tr := trialOf(loadState(t), "trial-002"); tr.State != TrialRunning || !strings.Contains(tr.Waiting, "queued in research") {
		t.Errorf("trial-002, still queued: %+v", tr)
	}
	// The queue admits trial-002 after all: it runs, and the sweep ends.
	writeStatus(t, queueRecords(t)["sw-trial-002"], admit.Status{State: admit.StateAdmitted, Admissions: 1, AdmittedAt: timePtr(time.Now().UTC())})
	f.admit(t, trialOf(loadState(t), "trial-002"))
	if err := waitRun(t, ch, 20*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	st := loadState(t)
	if st.Status != StatusCompleted || trialOf(st, "trial-002").State != TrialCompleted || trialOf(st, "trial-003").State != TrialCompleted {
		t.Errorf("sweep %s (%s): %+v", st.Status, st.Reason, st.Trials)
	}
	// The refused record is withdrawn; the admitted one, whose job ended,
	// is the admission controller's to forget.
	if r := queueRecords(t); r["sw-trial-001"] != nil || r["sw-trial-003"] != nil {
		t.Errorf("records left: %v", r)
	}
}
