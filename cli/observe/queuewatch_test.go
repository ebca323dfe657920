package observe

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/queue/admit"
	"github.com/gpujob/gpujob/internal/queue/queuekv"
	"github.com/gpujob/gpujob/internal/testagent"
	"github.com/gpujob/gpujob/jobspecs/acl"
)

const managementToken = "3f0c9a6e-52d4-4b8e-9a1f-7c2d5e8b1a40"

// aclConsul is a dev Consul with default-deny ACLs; the management token
// is its default token (its start-up probe needs one).
func aclConsul(t *testing.T) *testagent.Consul {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a Consul agent (not in -short)")
	}
	c, err := testagent.StartConsul(`acl {
  enabled        = true
  default_policy = "deny"
  tokens {
    initial_management = "` + managementToken + `"
    default            = "` + managementToken + `"
  }
}`)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}

func consulClient(t *testing.T, c *testagent.Consul, token string) *consul.Client {
	t.Helper()
	cfg := consul.DefaultConfig()
	cfg.Address, cfg.Token = c.Addr, token
	cl, err := consul.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// tokenWith is a token of a policy of rules.
func tokenWith(t *testing.T, m *consul.Client, name, rules string) string {
	t.Helper()
	p, _, err := m.ACL().PolicyCreate(&consul.ACLPolicy{Name: name, Rules: rules}, nil)
	if err != nil {
		t.Fatalf("policy %s: %v\n%s", name, err, rules)
	}
	tok, _, err := m.ACL().TokenCreate(&consul.ACLToken{Policies: []*consul.ACLTokenPolicyLink{{ID: p.ID}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return tok.SecretID
}

func putKV(t *testing.T, m *consul.Client, key string, v []byte) {
	t.Helper()
	if _, err := m.KV().Put(&consul.KVPair{Key: key, Value: v}, nil); err != nil {
		t.Fatal(err)
	}
}

// queuedRecord is the stored record of a 1-member job of gpus GPUs.
func queuedRecord(t *testing.T, ns, id, queue string, gpus int, submitted time.Time) []byte {
	t.Helper()
	cnt := uint64(gpus)
	job := &api.Job{ID: &id, Namespace: &ns, Type: ptr(api.JobTypeBatch),
		Meta: map[string]string{contract.MetaKind: contract.KindTrain, contract.MetaQueue: queue},
		TaskGroups: []*api.TaskGroup{{Name: ptr("train"), Count: ptr(1), Tasks: []*api.Task{{Name: "train", Driver: contract.DriverName,
			Resources: &api.Resources{CPU: ptr(100), MemoryMB: ptr(256), Devices: []*api.RequestedDevice{{Name: contract.GPUDevice, Count: &cnt}}}}}}}}
	b, err := json.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	out, err := admit.EncodeJobRecord(&admit.JobRecord{Format: admit.Format, ID: id, Namespace: ns, Queue: queue, Kind: admit.KindTrain,
		Members: 1, PerMember: admit.Resources{GPUs: gpus, CPUMHz: 100, MemoryMB: 256}, SubmittedAt: submitted,
		SubmittedBy: "alice", Job: b}, submitted)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// logLines collects what a watcher logs.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}

func (l *logLines) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			return true
		}
	}
	return false
}

// snapshotUntil takes snapshots of w until ok accepts one, or fails the
// test at a deadline.
func snapshotUntil(t *testing.T, w *Watcher, what string, ok func(*Snapshot) bool) *Snapshot {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		s, err := w.Snapshot(context.Background())
		if err == nil && ok(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: last %+v, %v", what, s, err)
		}
		select {
		case <-w.Changed():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// On a Consul with default-deny ACLs: an exporter whose token reads only
// the sweeps (the policy before the queue series) says in its log and in
// its snapshots' warnings that it cannot read the queues, and shows the
// rest; one with consul-exporter's token summarizes every queue from the
// records, statuses and counters, and follows their changes by blocking
// queries.
func TestWatcherReadsTheQueuesWithTheExportersToken(t *testing.T) {
	c := aclConsul(t)
	m := consulClient(t, c, managementToken)
	t0 := time.Now().UTC().Truncate(time.Second)
	// The queue tree, as apply, submit and the controller write it.
	cfg, err := queuekv.Encode(&queuekv.Record{Format: queuekv.Format, Queues: []queuekv.Queue{
		{Name: "team-a", GPUs: 2, Weight: 1, Priority: 50, Borrow: true}, {Name: "default", Weight: 1, Priority: 50}},
		File: "q.hcl", SHA256: strings.Repeat("ab", 32), AppliedBy: "ops@host", AppliedAt: t0})
	if err != nil {
		t.Fatal(err)
	}
	putKV(t, m, contract.QueueConfigKey, cfg)
	putKV(t, m, contract.QueueJobsPrefix+"/ml/run", queuedRecord(t, "ml", "run", "team-a", 3, t0.Add(-time.Hour)))
	putKV(t, m, contract.QueueJobsPrefix+"/ml/wait", queuedRecord(t, "ml", "wait", "team-a", 2, t0.Add(-20*time.Minute)))
	p, _, err := m.KV().Get(contract.QueueJobsPrefix+"/ml/run", nil)
	if err != nil || p == nil {
		t.Fatal(p, err)
	}
	admittedAt := t0.Add(-50 * time.Minute)
	st, err := admit.EncodeStatus(&admit.Status{Format: admit.Format, State: admit.StateAdmitted, RecordIndex: p.CreateIndex,
		Admissions: 1, AdmittedAt: &admittedAt})
	if err != nil {
		t.Fatal(err)
	}
	putKV(t, m, contract.QueueStatusPrefix+"/ml/run", st)
	stats := admit.NewStats()
	stats.Queue("team-a").Admitted(1, 10*time.Minute)
	sb, err := admit.EncodeStats(stats)
	if err != nil {
		t.Fatal(err)
	}
	putKV(t, m, contract.QueueStatsKey, sb)

	nomad := nomadapi.NewFake()
	nomad.SetJob(&api.Job{ID: ptr("run"), Namespace: ptr("ml"), Status: ptr("running"),
		Meta: map[string]string{contract.MetaKind: contract.KindTrain, contract.MetaQueue: "team-a"}})
	a := trainAlloc("r0", "run", "run.train[0]", "n1", []string{"G0", "G1", "G2"})
	a.Namespace = "ml"
	nomad.SetAlloc(a)

	watch := func(token string, logs *logLines) *Watcher {
		w := NewWatcher(Config{Nomad: nomad, Consul: consulClient(t, c, token), Logf: logs.logf, WaitTime: 10 * time.Second,
			Now: func() time.Time { return t0 }})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = w.Run(ctx); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
		return w
	}

	// The token of the policy before the queue series: sweeps only.
	oldLogs := &logLines{}
	old := watch(tokenWith(t, m, "exporter-sweeps-only", `key_prefix "gpujob/sweeps/" { policy = "read" }`), oldLogs)
	s := snapshotUntil(t, old, "a warning that the queues cannot be read", func(s *Snapshot) bool {
		return strings.Contains(strings.Join(s.Warnings, "\n"), "reading the queues' configuration from Consul")
	})
	if s.Queues != nil {
		t.Errorf("queues without read on them: %+v", s.Queues)
	}
	if len(s.Jobs) != 1 {
		t.Errorf("the rest of the snapshot is gone: %+v", s.Jobs)
	}
	if !oldLogs.has("consul-exporter") || !oldLogs.has("403") {
		t.Errorf("no log line names the failure and the fix: %q", oldLogs.lines)
	}

	// The current consul-exporter policy.
	pol, err := acl.Lookup("consul-exporter")
	if err != nil {
		t.Fatal(err)
	}
	rules, err := acl.Render(pol, acl.Params{})
	if err != nil {
		t.Fatal(err)
	}
	w := watch(tokenWith(t, m, "exporter", string(rules)), &logLines{})
	s = snapshotUntil(t, w, "the queues", func(s *Snapshot) bool { return len(s.Queues) == 2 && s.Queues[0].WaitingJobs == 1 })
	q := s.Queues[0]
	if q.Name != "team-a" || q.QuotaGPUs != 2 || q.UsedGPUs != 3 || q.BorrowedGPUs != 1 || q.WaitingGPUs != 2 ||
		q.OldestWaitSince == nil || !q.OldestWaitSince.Equal(t0.Add(-20*time.Minute)) {
		t.Errorf("team-a: %+v", q)
	}
	if q.Counters == nil || q.Counters.Admissions != 1 || q.Counters.LatencySumS != 600 {
		t.Errorf("team-a's counters: %+v", q.Counters)
	}
	for _, warn := range s.Warnings {
		if strings.Contains(warn, "queues") {
			t.Errorf("a warning with the exporter's token: %s", warn)
		}
	}

	// The controller admits the waiting job: the blocking query sees it.
	p, _, err = m.KV().Get(contract.QueueJobsPrefix+"/ml/wait", nil)
	if err != nil || p == nil {
		t.Fatal(p, err)
	}
	st, err = admit.EncodeStatus(&admit.Status{Format: admit.Format, State: admit.StateAdmitted, RecordIndex: p.CreateIndex,
		Admissions: 1, AdmittedAt: &t0})
	if err != nil {
		t.Fatal(err)
	}
	putKV(t, m, contract.QueueStatusPrefix+"/ml/wait", st)
	stats.Queue("team-a").Admitted(1, 20*time.Minute)
	if sb, err = admit.EncodeStats(stats); err != nil {
		t.Fatal(err)
	}
	putKV(t, m, contract.QueueStatsKey, sb)
	snapshotUntil(t, w, "the admission", func(s *Snapshot) bool {
		return len(s.Queues) == 2 && s.Queues[0].WaitingJobs == 0 && s.Queues[0].OldestWaitSince == nil &&
			s.Queues[0].Counters != nil && s.Queues[0].Counters.Admissions == 2
	})

	// Damaged counters: a warning, no counters, the rest stands.
	putKV(t, m, contract.QueueStatsKey, []byte(`{"format":1,"queues":{"team-a":null}}`))
	s = snapshotUntil(t, w, "the damaged counters' warning", func(s *Snapshot) bool {
		return strings.Contains(strings.Join(s.Warnings, "\n"), "queue stats")
	})
	if len(s.Queues) != 2 || s.Queues[0].Counters != nil || s.Queues[0].UsedGPUs != 3 {
		t.Errorf("with damaged counters: %+v", s.Queues)
	}
	// The configuration withdrawn: not in queue mode any more.
	if _, err := m.KV().Delete(contract.QueueConfigKey, nil); err != nil {
		t.Fatal(err)
	}
	snapshotUntil(t, w, "no queues", func(s *Snapshot) bool { return s.Queues == nil })
}
