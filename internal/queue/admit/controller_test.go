package admit

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/queue/policy"
	"github.com/gpujob/gpujob/internal/queue/queuekv"
)

func TestDefaultKeysAreTheContracts(t *testing.T) {
	c := &Controller{}
	for _, k := range []struct{ got, want string }{
		{c.jobsPrefix(), contract.QueueJobsPrefix},
		{c.statusPrefix(), contract.QueueStatusPrefix},
		{c.leaderKey(), contract.QueueLeaderKey},
		{c.statsKey(), contract.QueueStatsKey},
	} {
		if k.got != k.want {
			t.Errorf("key %q, want %q", k.got, k.want)
		}
	}
}

// A gang is registered only when every member fits: by the policy (the
// cluster's free GPUs) and then by Nomad's plan (work the policy did not
// see); one that does not stays queued, with why in plain words.
func TestAdmitsAGangOnlyWhenEveryMemberFits(t *testing.T) {
	for _, tc := range []struct {
		name      string
		members   int
		gpus      int
		planFails bool
		admitted  bool
		reason    string
	}{
		{name: "fits", members: 2, gpus: 4, admitted: true},
		{name: "one member too many", members: 3, gpus: 4, reason: "GPUs"},
		{name: "the plan refuses", members: 2, gpus: 4, planFails: true, reason: "Nomad's plan cannot place all 2 members at once now"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, 2, 4)
			f.lead(f.c)
			// 8 GPUs; the gang of interest goes second, behind a running 1-GPU... none: empty cluster
			// but for a smaller job holding one GPU on n1 when the gang needs 3 × 4.
			job := jobOf("default", "gang", "", tc.members, tc.gpus)
			f.nomad.planFails["default/gang"] = tc.planFails
			f.submit(recordOf(job, 0, t0))
			res := f.reconcile(f.c)
			st := f.status("default/gang")
			if got := f.nomad.registered("default/gang"); (got == 1) != tc.admitted || got > 1 {
				t.Fatalf("registered %d times; result %+v", got, res)
			}
			if tc.admitted {
				if st.State != StateAdmitted || st.Admissions != 1 || st.AdmittedAt == nil {
					t.Fatalf("status %+v", st)
				}
				if m := f.nomad.jobs["default/gang"].job.Meta[contract.MetaAdmission]; !strings.HasSuffix(m, ".1") {
					t.Errorf("marker %q", m)
				}
				return
			}
			if st.State != StateQueued && st.State != StateRefused || !strings.Contains(st.Reason, tc.reason) {
				t.Fatalf("status %+v, want queued with %q", st, tc.reason)
			}
			if st.Admitting != 0 {
				t.Errorf("admitting %d left after a refused plan", st.Admitting)
			}
		})
	}
}

// A job that waits for capacity says so, with its position.
func TestWaitingJobsHaveAPositionAndReason(t *testing.T) {
	f := newFixture(t, 1, 4)
	f.lead(f.c)
	f.submit(recordOf(jobOf("default", "a", "", 1, 4), 0, t0))
	f.submit(recordOf(jobOf("default", "b", "", 1, 4), 0, t0.Add(time.Second)))
	f.submit(recordOf(jobOf("default", "c", "", 1, 2), 0, t0.Add(2*time.Second)))
	f.reconcile(f.c)
	if st := f.status("default/a"); st.State != StateAdmitted {
		t.Fatalf("a: %+v", st)
	}
	for n, pos := range map[string]int{"default/b": 1, "default/c": 2} {
		st := f.status(n)
		if st.State != StateQueued || st.Position != pos || st.Reason == "" {
			t.Errorf("%s: %+v, want queued at %d with a reason", n, st, pos)
		}
	}
	// a ends: b goes next (FIFO), its records of a are forgotten.
	f.nomad.finish("default/a")
	f.now = f.now.Add(2 * time.Second)
	res := f.reconcile(f.c)
	if len(res.Finished) != 1 || f.status("default/b").State != StateAdmitted {
		t.Fatalf("after a ended: %+v, b %+v", res, f.status("default/b"))
	}
	if p, _, _ := f.client.KV().Get(JobKey(f.c.jobsPrefix(), "default", "a"), nil); p != nil {
		t.Error("a's record outlived its job")
	}
}

// A job that ends soon after its admission gives its GPUs back in the
// round that sees its members end, not once some grace has passed: the
// next job is admitted in that round. (The controller counted an admitted
// job without live allocations at its admission's placement until 15 s
// after the admission, and looked again only at the next resync: on real
// agents 4-GPU gangs of 3 s followed each other every 25 s.)
func TestAJobEndingSoonAfterItsAdmissionFreesItsGPUsAtOnce(t *testing.T) {
	f := newFixture(t, 1, 4)
	f.lead(f.c)
	f.submit(recordOf(jobOf("default", "a", "", 2, 2), 0, t0))
	f.submit(recordOf(jobOf("default", "b", "", 2, 2), 0, t0.Add(time.Second)))
	f.reconcile(f.c)
	if st := f.status("default/a"); st.State != StateAdmitted {
		t.Fatalf("a: %+v", st)
	}
	// Registered, its members not placed yet: a is not forgotten, and
	// its placement still holds the cluster for it.
	f.nomad.mu.Lock()
	placed := f.nomad.jobs["default/a"].allocs
	f.nomad.jobs["default/a"].allocs = nil
	f.nomad.mu.Unlock()
	f.now = f.now.Add(time.Second)
	res := f.reconcile(f.c)
	if len(res.Finished) != 0 || len(res.Admitted) != 0 || f.status("default/a").State != StateAdmitted || f.status("default/b").State != StateQueued {
		t.Fatalf("a registered, not placed yet: %+v; a %+v, b %+v", res, f.status("default/a"), f.status("default/b"))
	}
	f.nomad.mu.Lock()
	f.nomad.jobs["default/a"].allocs = placed
	f.nomad.mu.Unlock()
	// a's members complete 2 s after its admission: b is admitted at once.
	f.now = f.now.Add(time.Second)
	f.nomad.complete("default/a")
	res = f.reconcile(f.c)
	if len(res.Finished) != 1 || res.Finished[0] != "default/a" || len(res.Admitted) != 1 || res.Admitted[0] != "default/b" {
		t.Fatalf("a ended 2 s after its admission: %+v, b %+v; want a forgotten and b admitted in that round", res, f.status("default/b"))
	}
}

// A crash between registering and recording the admission, or between
// recording the intent and registering, never registers a job twice: the
// next leader reads Nomad's job (its admission marker) first.
func TestNeverRegistersTwiceAcrossACrash(t *testing.T) {
	for _, crashAt := range []string{"after register", "after plan"} {
		t.Run(crashAt, func(t *testing.T) {
			f := newFixture(t, 2, 4)
			s1 := f.lead(f.c)
			f.submit(recordOf(jobOf("default", "gang", "", 2, 4), 0, t0))
			ctx, crash := context.WithCancel(ctxOf(t))
			hook := func(string) { crash() }
			if crashAt == "after register" {
				f.nomad.onRegister = hook
			} else {
				f.nomad.onPlan = hook
			}
			if _, err := f.c.Reconcile(ctx); err == nil {
				t.Fatal("the crashed round succeeded")
			}
			f.nomad.onRegister, f.nomad.onPlan = nil, nil
			if st := f.status("default/gang"); st == nil || st.Admitting != 1 || st.State != StateQueued {
				t.Fatalf("the crashed round left %+v, want the intent (admitting 1) recorded", st)
			}
			// kill -9: the session ends without a word, a new leader comes.
			s1.StopRenewing()
			_ = s1.Close(context.Background())
			c2 := f.controller("c2")
			f.lead(c2)
			for range 3 {
				f.reconcile(c2)
			}
			if n := f.nomad.registered("default/gang"); n != 1 {
				t.Fatalf("registered %d times", n)
			}
			if st := f.status("default/gang"); st.State != StateAdmitted || st.Admissions != 1 || st.Admitting != 0 {
				t.Fatalf("status %+v", st)
			}
		})
	}
}

// A higher-priority gang preempts a whole lower one; the victim is
// stopped, says who preempted it and why, and once stopped is queued
// again at its old place: ahead of a job submitted after it.
func TestPreemptedGangIsRequeuedAtItsOldPosition(t *testing.T) {
	f := newFixture(t, 1, 4)
	f.lead(f.c)
	f.nomad.slowStop = true
	f.config(queuekv.Queue{Name: "default", Weight: 1, Priority: 50})
	f.submit(recordOf(jobOf("default", "low", "", 1, 4), 10, t0))
	f.reconcile(f.c)
	if f.status("default/low").State != StateAdmitted {
		t.Fatal("low not admitted")
	}
	f.now = f.now.Add(time.Minute)
	f.submit(recordOf(jobOf("default", "later", "", 1, 4), 10, t0.Add(30*time.Second)))
	f.submit(recordOf(jobOf("default", "high", "", 1, 4), 90, t0.Add(time.Minute)))
	res := f.reconcile(f.c)
	if len(res.Preempted) != 1 || res.Preempted[0] != "default/low" {
		t.Fatalf("preempted %v", res.Preempted)
	}
	st := f.status("default/low")
	if st.State != StatePreempted || st.PreemptedBy != "default/high" || !strings.Contains(st.PreemptedWhy, "priority 90 > 10") {
		t.Fatalf("low: %+v", st)
	}
	if !f.status("default/high").Nominated {
		t.Error("high not nominated")
	}
	// Still stopping: nothing more happens.
	res = f.reconcile(f.c)
	if len(res.Admitted) != 0 || len(res.Preempted) != 0 {
		t.Fatalf("while low stops: %+v", res)
	}
	f.nomad.release()
	res = f.reconcile(f.c)
	if len(res.Requeued) != 1 || len(res.Admitted) != 1 || res.Admitted[0] != "default/high" {
		t.Fatalf("after low stopped: %+v", res)
	}
	low, later := f.status("default/low"), f.status("default/later")
	if low.State != StateQueued || low.Position != 1 || later.Position != 2 || low.Preemptions != 1 || low.PreemptedBy != "default/high" {
		t.Fatalf("low %+v\nlater %+v", low, later)
	}
	// Readmitted later with a new admission (a new marker): registered
	// over the stopped job, once.
	f.nomad.finish("default/high")
	f.now = f.now.Add(time.Minute)
	f.reconcile(f.c)
	if st := f.status("default/low"); st.State != StateAdmitted || st.Admissions != 2 {
		t.Fatalf("low readmitted: %+v", st)
	}
	if n := f.nomad.registered("default/low"); n != 2 {
		t.Fatalf("low registered %d times, want 2 (once per admission)", n)
	}
}

// Records that are not what submit writes are refused with the reason and
// never planned, registered or counted.
func TestTamperedRecordsAreRefused(t *testing.T) {
	f := newFixture(t, 2, 4)
	f.lead(f.c)
	good := func(id string) *JobRecord { return recordOf(jobOf("default", id, "", 1, 1), 0, t0) }
	raw := func(r *JobRecord) []byte { b, _ := json.Marshal(r); return b }
	cases := map[string]struct {
		value []byte
		want  string
	}{}
	add := func(id string, b []byte, want string) {
		cases[id] = struct {
			value []byte
			want  string
		}{b, want}
	}
	r := good("liar")
	r.PerMember.GPUs = 0 // the job asks for 1
	add("liar", raw(r), "a member asks for 1 GPUs")
	r = good("elsewhere")
	other := jobOf("team-b", "elsewhere", "", 1, 1)
	r.Job, _ = json.Marshal(other)
	add("elsewhere", raw(r), `job namespace "team-b" differs`)
	add("unknown-field", []byte(strings.Replace(string(raw(good("unknown-field"))), `{"format":1`, `{"format":1,"admitted":true`, 1)), "unknown field")
	add("trailing", append(raw(good("trailing")), []byte(`{}`)...), "more after")
	add("other-key", raw(good("someone-else")), "its key")
	r = good("future")
	r.SubmittedAt = t0.Add(24 * time.Hour)
	add("future", raw(r), "future")
	r = good("marked")
	j := jobOf("default", "marked", "", 1, 1)
	j.Meta[contract.MetaAdmission] = "1.1"
	r.Job, _ = json.Marshal(j)
	add("marked", raw(r), "controller's to set")
	r = good("escape")
	r.SubmittedBy = "x\x1b[2J"
	add("escape", raw(r), "control character")
	for id, c := range cases {
		f.put(JobKey(f.c.jobsPrefix(), "default", id), c.value)
	}
	res := f.reconcile(f.c)
	if f.nomad.plans != 0 || len(f.nomad.registers) != 0 || f.nomad.stops != 0 {
		t.Fatalf("acted on tampered records: %d plans, %v registers", f.nomad.plans, f.nomad.registers)
	}
	for id, c := range cases {
		st := f.status("default/" + id)
		if st == nil || st.State != StateRefused || !strings.Contains(st.Reason, "record is invalid") || !strings.Contains(st.Reason, c.want) {
			t.Errorf("%s: status %+v, want refused with %q", id, st, c.want)
		}
	}
	if len(res.Refused) != len(cases) {
		t.Errorf("refused %d of %d", len(res.Refused), len(cases))
	}
	// Consul refuses values over its limit; one that got there anyway
	// (kv_max_value_size raised) is refused unread.
	if _, _, err := DecodeJobRecord([]byte(`{"format":1,"id":"`+strings.Repeat("a", MaxRecordBytes)+`"}`), t0); err == nil || !strings.Contains(err.Error(), "a record is at most") {
		t.Errorf("a huge record: %v", err)
	}
	// A key that is not <namespace>/<id> is ignored, not acted on.
	f.put(f.c.jobsPrefix()+"/default/a/b", raw(good("a")))
	f.reconcile(f.c)
	if f.nomad.plans != 0 {
		t.Fatal("planned a job from a key outside the layout")
	}
}

// An invalid configuration stops all action: nothing is admitted while
// what the operator meant is unknown.
func TestInvalidConfigurationActsOnNothing(t *testing.T) {
	f := newFixture(t, 1, 4)
	f.lead(f.c)
	f.put(queuekv.ConfigKey(f.prefix), []byte(`{"format":1,"queues":[]}`))
	f.submit(recordOf(jobOf("default", "a", "", 1, 1), 0, t0))
	if _, err := f.c.Reconcile(ctxOf(t)); err == nil || !strings.Contains(err.Error(), "queue configuration") {
		t.Fatalf("reconcile: %v", err)
	}
	if f.nomad.plans != 0 {
		t.Fatal("planned under an invalid configuration")
	}
}

// Only the leader reconciles: a controller that does not lead touches
// neither Nomad nor Consul, and one deposed mid-term writes nothing.
func TestNonLeaderDoesNothing(t *testing.T) {
	f := newFixture(t, 1, 4)
	f.submit(recordOf(jobOf("default", "a", "", 1, 1), 0, t0))
	if _, err := f.c.Reconcile(ctxOf(t)); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("reconcile without leading: %v", err)
	}
	if f.nomad.calls != 0 || f.status("default/a") != nil {
		t.Fatalf("a non-leader acted: %d Nomad calls", f.nomad.calls)
	}
	// A session that does not hold the leader key cannot write: as if
	// deposed after checking.
	s := f.lead(f.c)
	c2 := f.controller("c2")
	c2.lead(s.ID()+"x", make(chan struct{}))
	if _, err := c2.Reconcile(ctxOf(t)); err == nil || f.status("default/a") != nil {
		t.Fatalf("a deposed leader wrote: %v", err)
	}
}

// Run: one of two controllers leads; a queue configuration applied later
// makes the leader admit a job that named a queue it did not know.
func TestRunReconcilesOnConfigChange(t *testing.T) {
	f := newFixture(t, 1, 4)
	f.config(queuekv.Queue{Name: "default", Weight: 1, Priority: 50})
	f.submit(recordOf(jobOf("default", "a", "team-b", 1, 2), 0, t0))
	ctx, cancel := context.WithCancel(ctxOf(t))
	done := make(chan error, 2)
	c1, c2 := f.controller("c1"), f.controller("c2")
	for _, c := range []*Controller{c1, c2} {
		c.Resync = time.Hour // only changes wake it
		go func() { done <- c.Run(ctx) }()
	}
	waitFor(t, "job a refused (unknown queue)", func() bool {
		st := f.status("default/a")
		return st != nil && st.State == StateRefused && strings.Contains(st.Reason, "team-b")
	})
	f.config(queuekv.Queue{Name: "default", Weight: 1, Priority: 50}, queuekv.Queue{Name: "team-b", Weight: 1, Priority: 50})
	waitFor(t, "job a admitted after the configuration changed", func() bool {
		st := f.status("default/a")
		return st != nil && st.State == StateAdmitted
	})
	cancel()
	for range 2 {
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}
	if n := f.nomad.registered("default/a"); n != 1 {
		t.Fatalf("registered %d times by two controllers", n)
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// gpujob's own helper jobs (the gateway, the exporter, the controllers)
// hold resources outside every queue: they use no queue's quota, and
// their nodes offer what they leave.
func TestHelperJobsAreOutsideTheQueues(t *testing.T) {
	f := newFixture(t, 1, 4)
	f.lead(f.c)
	f.config(queuekv.Queue{Name: "default", GPUs: 2, Weight: 1, Priority: 50})
	// A helper holding 2 GPUs (as if an exporter asked for them): were it
	// counted in queue default, its quota of 2 would be spent.
	f.nomad.outside = append(f.nomad.outside, Alloc{ID: "x1", Namespace: "default", JobID: "gpujob-exporter", Node: "n1",
		JobMeta:   map[string]string{contract.MetaKind: contract.KindExporter},
		Resources: policy.Resources{GPUs: 2, CPUMHz: 100, MemoryMB: 64}})
	f.submit(recordOf(jobOf("default", "small", "", 1, 2), 0, t0))
	f.submit(recordOf(jobOf("default", "big", "", 1, 4), 0, t0.Add(time.Second)))
	f.reconcile(f.c)
	if st := f.status("default/small"); st.State != StateAdmitted {
		t.Fatalf("a 2-GPU job in an empty 2-GPU queue: %+v", st)
	}
	// The node's 4 GPUs less the helper's 2 are held: big cannot fit the
	// node, whatever its queue says.
	if st := f.status("default/big"); st.State == StateAdmitted {
		t.Fatalf("admitted onto GPUs a helper holds: %+v", st)
	}
}

// A job withdrawn (gpujob stop deletes its record, check-and-set) while the
// controller is admitting it never runs: withdrawn before Register, it is
// not registered; withdrawn after, the round's last write fails on the
// record's check and the next round stops the job it registered.
func TestAJobWithdrawnWhileBeingAdmittedDoesNotRun(t *testing.T) {
	for _, at := range []string{"after plan", "after register"} {
		t.Run(at, func(t *testing.T) {
			f := newFixture(t, 2, 4)
			f.lead(f.c)
			f.submit(recordOf(jobOf("default", "gang", "", 2, 4), 0, t0))
			key := JobKey(f.c.jobsPrefix(), "default", "gang")
			withdraw := func(string) {
				p, _, err := f.client.KV().Get(key, nil)
				if err != nil || p == nil {
					t.Errorf("reading the record to withdraw it: %v, %v", p, err)
					return
				}
				if ok, _, err := f.client.KV().DeleteCAS(&api.KVPair{Key: key, ModifyIndex: p.ModifyIndex}, nil); !ok || err != nil {
					t.Errorf("withdrawing: %v, %v", ok, err)
				}
			}
			if at == "after plan" {
				f.nomad.onPlan = withdraw
			} else {
				f.nomad.onRegister = withdraw
			}
			_, err := f.c.Reconcile(ctxOf(t))
			f.nomad.onPlan, f.nomad.onRegister = nil, nil
			if at == "after register" && err == nil {
				t.Fatal("the round recorded an admission of a withdrawn job")
			}
			res := f.reconcile(f.c)
			j := f.nomad.jobs["default/gang"]
			switch at {
			case "after plan":
				if j != nil {
					t.Fatalf("registered a job withdrawn before its registration: %+v", j.job.Meta)
				}
			case "after register":
				if j == nil || !j.stop {
					t.Fatalf("the job registered as it was withdrawn still runs (result %+v)", res)
				}
				if len(res.Withdrawn) != 1 {
					t.Errorf("withdrawn %v, want the gang", res.Withdrawn)
				}
			}
			if st := f.status("default/gang"); st != nil {
				t.Errorf("a status outlived its withdrawn record: %+v", st)
			}
			// Nothing more happens to it.
			f.reconcile(f.c)
			if n := f.nomad.registered("default/gang"); n > 1 {
				t.Errorf("registered %d times", n)
			}
		})
	}
}
