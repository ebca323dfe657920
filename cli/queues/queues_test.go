package queues

import (
	"bytes"
	"context"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/cli/explain"
	"github.com/gpujob/gpujob/cli/observe"
	"github.com/gpujob/gpujob/internal/queue/policy"
	"github.com/gpujob/gpujob/internal/queue/queuefile"
	"github.com/gpujob/gpujob/internal/queue/queuekv"
	"github.com/gpujob/gpujob/internal/testagent"
)

var shared testagent.Lazy

func TestMain(m *testing.M) { os.Exit(shared.Main(m)) }

var now = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

func parse(t *testing.T, src string) *queuefile.File {
	t.Helper()
	f, _, diags := queuefile.Parse([]byte(src), "queues.hcl")
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	return f
}

func TestDiff(t *testing.T) {
	a := queuekv.Queue{Name: "a", GPUs: 8, Weight: 1, Priority: 50}
	b := queuekv.Queue{Name: "b", Weight: 1, Priority: 50}
	a2 := a
	a2.GPUs, a2.Borrow, a2.Cohort = 4, true, "research"
	c := queuekv.Queue{Name: "c", GPUs: 2, Weight: 3, Priority: 70}
	changes, unchanged := Diff([]queuekv.Queue{a, b}, []queuekv.Queue{c, a2})
	want := []Change{
		{Queue: "c", Action: Added, Settings: &c},
		{Queue: "a", Action: Changed, Fields: []FieldChange{{"gpus", "8", "4"}, {"borrow", "off", "on"}, {"cohort", "-", "research"}}},
		{Queue: "b", Action: Removed},
	}
	if !reflect.DeepEqual(changes, want) || unchanged != nil {
		t.Errorf("changes %+v, unchanged %v\nwant %+v", changes, unchanged, want)
	}
	if changes, unchanged := Diff([]queuekv.Queue{a, b}, []queuekv.Queue{a, b}); changes != nil || len(unchanged) != 2 {
		t.Errorf("same: %+v %v", changes, unchanged)
	}
}

func TestApply(t *testing.T) {
	store := queuekv.New(shared.Client(t), "test/apply")
	ctx := context.Background()
	apply := func(src string, dry bool) *ApplyResult {
		t.Helper()
		res, err := Apply(ctx, store, ApplyOptions{Path: "queues.hcl", File: parse(t, src), DryRun: dry, AppliedBy: "alice@desk", Now: now})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	first := `queue "default" {}
queue "team-a" {
  gpus = 8
}`
	// A dry run compares with the default queue, which `queue "default"
	// {}` is, and writes nothing.
	res := apply(first, true)
	if res.Written || len(res.Changes) != 1 || res.Changes[0].Action != Added || len(res.Unchanged) != 1 {
		t.Fatalf("dry run %+v", res)
	}
	if r, _, _ := store.Read(ctx); r != nil {
		t.Fatalf("a dry run wrote %+v", r)
	}
	res = apply(first, false)
	if !res.Written || res.Index == 0 || res.Previous != nil {
		t.Fatalf("apply %+v", res)
	}
	r, idx, err := store.Read(ctx)
	if err != nil || idx != res.Index || r.AppliedBy != "alice@desk" || !r.AppliedAt.Equal(now) || r.SHA256 != parse(t, first).SHA256 ||
		r.File != "queues.hcl" || len(r.Queues) != 2 {
		t.Fatalf("stored %+v at %d, %v", r, idx, err)
	}
	// The same file again (a comment aside): nothing to write.
	if res := apply(first+"\n# reviewed\n", false); res.Written || len(res.Changes) != 0 || len(res.Unchanged) != 2 ||
		res.Previous == nil || res.Previous.AppliedBy != "alice@desk" {
		t.Fatalf("unchanged %+v", res)
	}
	// No default queue: said so. Lowering a quota is a change like any.
	res = apply(`queue "team-a" {
  gpus = 4
}`, false)
	if !res.Written || len(res.Notes) != 1 || !strings.Contains(res.Notes[0], `no queue "default"`) {
		t.Fatalf("%+v", res)
	}
	var out bytes.Buffer
	res.Print(&out)
	for _, want := range []string{"~ team-a   gpus 8 → 4", "- default", "note: no queue \"default\"", "applied (Consul index"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	// An empty file brings back the default queue alone.
	res = apply("", false)
	if !res.Written || len(res.Changes) != 2 {
		t.Fatalf("%+v", res)
	}
	if l, err := ReadList(ctx, store); err != nil || !l.Implicit || l.Applied == nil || len(l.Queues) != 1 || l.Queues[0] != DefaultQueue {
		t.Fatalf("list after the empty file: %+v %v", l, err)
	}
}

// An apply that races another writes nothing and says who came first.
func TestApplyConflict(t *testing.T) {
	store := queuekv.New(shared.Client(t), "test/conflict")
	ctx := context.Background()
	other := &queuekv.Record{Format: queuekv.Format, Queues: []queuekv.Queue{{Name: "bob", Weight: 1, Priority: 50}},
		File: "bob.hcl", SHA256: strings.Repeat("b", 64), AppliedBy: "bob@laptop", AppliedAt: now}
	testHookAfterRead = func() {
		if _, err := store.Write(ctx, other, 0); err != nil {
			t.Error(err)
		}
	}
	defer func() { testHookAfterRead = nil }()
	_, err := Apply(ctx, store, ApplyOptions{Path: "q.hcl", File: parse(t, `queue "alice" {}`), AppliedBy: "alice@desk", Now: now})
	if err == nil || !strings.Contains(err.Error(), "changed while this apply ran (applied by bob@laptop") ||
		!strings.Contains(err.Error(), "nothing was written") {
		t.Fatalf("%v", err)
	}
	if r, _, _ := store.Read(ctx); r == nil || r.Queues[0].Name != "bob" {
		t.Fatalf("stored %+v", r)
	}
}

// An invalid stored configuration is replaced by an apply, and said so;
// list refuses to show it.
func TestApplyReplacesAnInvalidConfiguration(t *testing.T) {
	c := shared.Client(t)
	store := queuekv.New(c, "test/invalid")
	ctx := context.Background()
	if _, err := c.KV().Put(&consulapi.KVPair{Key: store.Key(), Value: []byte(`{"format":1}`)}, nil); err != nil {
		t.Fatal(err)
	}
	var inv *queuekv.InvalidError
	if _, err := ReadList(ctx, store); !errors.As(err, &inv) {
		t.Fatalf("list: %v", err)
	}
	res, err := Apply(ctx, store, ApplyOptions{Path: "q.hcl", File: parse(t, `queue "a" {}`), AppliedBy: "a@b", Now: now})
	if err != nil || !res.Written || len(res.Notes) == 0 || !strings.Contains(res.Notes[0], "is invalid") {
		t.Fatalf("%+v %v", res, err)
	}
}

// Status counts each held GPU once: in its job's queue, in the default
// queue for a job that names none, outside every queue for a job gpujob
// did not submit; a queue the configuration lacks shows as not declared.
func TestStatusOf(t *testing.T) {
	holder := func(job, kind, queue string) *observe.Holder {
		return &observe.Holder{Namespace: "default", JobID: job, Kind: kind, Queue: queue}
	}
	snap := &observe.Snapshot{Nodes: []observe.Node{{Name: "n1", GPUs: []observe.GPU{
		{Healthy: true, Holder: holder("a1", "train", "team-a")},
		{Healthy: true, Holder: holder("a1", "train", "team-a")},
		{Healthy: true, Holder: holder("plain", "train", "")},
		{Healthy: true, Holder: holder("other", "", "")},
		{Healthy: true},
		{Healthy: false},
	}}, {Name: "n2", GPUs: []observe.GPU{
		{Healthy: true, Holder: holder("svc", "service", "gone")},
	}}}, Queue: []observe.Waiting{{Namespace: "default", JobID: "a2", Kind: "train", Queue: "team-a", Queued: 2, Since: now}}}
	rec := &queuekv.Record{Format: queuekv.Format, Queues: []queuekv.Queue{
		{Name: "team-a", GPUs: 1, Weight: 1, Priority: 50}, {Name: "default", Weight: 1, Priority: 50}},
		File: "q.hcl", SHA256: strings.Repeat("a", 64), AppliedBy: "ops", AppliedAt: now}
	st, err := StatusOf(rec, 7, snap, "")
	if err != nil {
		t.Fatal(err)
	}
	if st.Cluster != (ClusterUse{GPUs: 7, Healthy: 6, InUse: 5, Free: 1, Outside: 1}) {
		t.Errorf("cluster %+v", st.Cluster)
	}
	got := map[string]QueueStatus{}
	var names []string
	for _, q := range st.Queues {
		got[q.Name] = q
		names = append(names, q.Name)
	}
	if strings.Join(names, ",") != "team-a,default,gone" {
		t.Errorf("queues in order %v", names)
	}
	if q := got["team-a"]; !q.Configured || q.UsedGPUs != 2 || len(q.Jobs) != 1 || q.Jobs[0] != (JobUse{"default", "a1", "train", 2}) ||
		len(q.Waiting) != 1 || q.Waiting[0].Queued != 2 {
		t.Errorf("team-a %+v", q)
	}
	if q := got["default"]; q.UsedGPUs != 1 || q.Jobs[0].JobID != "plain" {
		t.Errorf("default %+v", q)
	}
	if q := got["gone"]; q.Configured || q.UsedGPUs != 1 {
		t.Errorf("gone %+v", q)
	}
	var out bytes.Buffer
	if err := st.Print(&out, false); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Cluster: 7 GPUs (6 healthy), 5 in use, 1 free; 1 held by jobs gpujob did not submit",
		"queue team-a uses 2 GPUs, over its quota of 1", "gone (not declared)", "jobs name queue gone"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if st, err := StatusOf(rec, 7, snap, "gone"); err != nil || len(st.Queues) != 1 {
		t.Errorf("status of one: %+v %v", st, err)
	}
	var unknown *policy.UnknownQueueError
	if _, err := StatusOf(rec, 7, snap, "nope"); !errors.As(err, &unknown) || !strings.Contains(err.Error(), "(queues: default, team-a)") {
		t.Errorf("unknown: %v", err)
	}
	// Without a configuration: the default queue, holding every gpujob
	// job's GPUs whatever queue its meta names.
	st, err = StatusOf(nil, 0, snap, "")
	if err != nil || !st.Implicit || st.Queues[0].Name != "default" || !st.Queues[0].Configured || st.Applied != nil {
		t.Fatalf("%+v %v", st, err)
	}
}

func TestNodes(t *testing.T) {
	got := Nodes([]explain.Node{
		{Name: "a", GPUs: 4, CPU: 8000, MemoryMiB: 16384},
		{Name: "b", GPUs: 2, Ineligible: true},
		{Name: "c", GPUs: 2, DriverProblem: "no gpujob driver"},
		{Name: "d", GPUs: 1},
	})
	want := []policy.Node{
		{Name: "a", Capacity: policy.Resources{GPUs: 4, CPUMHz: 8000, MemoryMB: 16384}},
		{Name: "d", Capacity: policy.Resources{GPUs: 1, CPUMHz: 1 << 30, MemoryMB: 1 << 30}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%+v", got)
	}
}
