package queuekv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/consul"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/queue/policy"
	"github.com/gpujob/gpujob/internal/testagent"
)

var shared testagent.Lazy

func TestMain(m *testing.M) { os.Exit(shared.Main(m)) }

// store is a Store of its own for one test, under a prefix no other test
// uses.
func store(t *testing.T) Store {
	t.Helper()
	return New(shared.Client(t), "test/"+strings.ReplaceAll(t.Name(), "/", "-"))
}

var applied = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

func record(queues ...Queue) *Record {
	return &Record{Format: Format, Queues: queues, File: "queues.hcl", SHA256: strings.Repeat("ab", 32),
		AppliedBy: "alice@desk", AppliedAt: applied}
}

var teamA = Queue{Name: "team-a", GPUs: 8, Weight: 2, Borrow: true, Priority: 60, Cohort: "research"}

func TestDefaultKeyIsTheContracts(t *testing.T) {
	if got := New(nil, "").Key(); got != contract.QueueConfigKey {
		t.Fatalf("key %q, want %q", got, contract.QueueConfigKey)
	}
}

func TestWriteAndRead(t *testing.T) {
	s := store(t)
	ctx := context.Background()
	r, idx, err := s.Read(ctx)
	if r != nil || idx != 0 || err != nil {
		t.Fatalf("empty store: %+v %d %v", r, idx, err)
	}
	want := record(teamA, Queue{Name: "default", Weight: 1, Priority: 50})
	idx, err = s.Write(ctx, want, 0)
	if err != nil || idx == 0 {
		t.Fatalf("write: %d %v", idx, err)
	}
	got, idx2, err := s.Read(ctx)
	if err != nil || idx2 != idx {
		t.Fatalf("read: %d (wrote at %d) %v", idx2, idx, err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("read %+v\nwant %+v", got, want)
	}
	cfg := got.Config()
	if len(cfg.Queues) != 2 || cfg.Queues[0] != (policy.QueueConfig{Name: "team-a", GPUs: 8, Weight: 2, Borrow: true, Priority: 60, Cohort: "research"}) {
		t.Errorf("config %+v", cfg)
	}
	// The next write checks-and-sets against what it read.
	if _, err := s.Write(ctx, record(teamA), idx2); err != nil {
		t.Fatal(err)
	}
}

// Two applies that read the same configuration cannot both write: the
// second fails with ErrConflict and leaves the first's configuration.
func TestConcurrentWritesConflict(t *testing.T) {
	s := store(t)
	ctx := context.Background()
	if _, err := s.Write(ctx, record(teamA), 0); err != nil {
		t.Fatal(err)
	}
	_, idx, err := s.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write(ctx, record(Queue{Name: "first", Weight: 1, Priority: 50}), idx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write(ctx, record(Queue{Name: "second", Weight: 1, Priority: 50}), idx); !errors.Is(err, ErrConflict) {
		t.Fatalf("stale write: %v, want ErrConflict", err)
	}
	// Creating one where one exists is a conflict too.
	if _, err := s.Write(ctx, record(Queue{Name: "third", Weight: 1, Priority: 50}), 0); !errors.Is(err, ErrConflict) {
		t.Fatalf("create over an existing one: %v, want ErrConflict", err)
	}
	got, _, err := s.Read(ctx)
	if err != nil || got.Queues[0].Name != "first" {
		t.Fatalf("after the conflicts: %+v %v", got, err)
	}

	// Racing for real: of 8 writers from the same index, exactly one wins.
	_, idx, _ = s.Read(ctx)
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins, conflicts := 0, 0
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.Write(ctx, record(Queue{Name: fmt.Sprintf("w%d", i), Weight: 1, Priority: 50}), idx)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				wins++
			case errors.Is(err, ErrConflict):
				conflicts++
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if wins != 1 || conflicts != 7 {
		t.Fatalf("%d wins and %d conflicts, want 1 and 7", wins, conflicts)
	}
}

// A value someone wrote into the key behind gpujob's back is an error on
// read, whatever it holds, never a configuration.
func TestTamperedValueIsRejected(t *testing.T) {
	s := store(t)
	ctx := context.Background()
	good, err := json.Marshal(record(teamA))
	if err != nil {
		t.Fatal(err)
	}
	edit := func(f func(m map[string]any)) string {
		var m map[string]any
		if err := json.Unmarshal(good, &m); err != nil {
			t.Fatal(err)
		}
		f(m)
		b, _ := json.Marshal(m)
		return string(b)
	}
	queue := func(k string, v any) func(m map[string]any) {
		return func(m map[string]any) { m["queues"].([]any)[0].(map[string]any)[k] = v }
	}
	for _, tc := range []struct {
		name, value, want string
	}{
		{"not JSON", "queue \"a\" {}", "not a queue configuration record"},
		{"empty", "", "not a queue configuration record"},
		{"two objects", string(good) + string(good), "more after the JSON object"},
		{"unknown field", edit(func(m map[string]any) { m["admin"] = true }), `unknown field "admin"`},
		{"unknown queue field", edit(queue("quota", 100)), `unknown field "quota"`},
		{"other format", edit(func(m map[string]any) { m["format"] = 2 }), "format 2"},
		{"negative quota", edit(queue("gpus", -8)), "gpus = -8"},
		{"zero weight", edit(queue("weight", 0)), "weight = 0"},
		{"bad name", edit(queue("name", "../../gpujob/sweeps")), "is not a queue name"},
		{"escape sequence in a name", edit(queue("name", "a\x1b]0;pwned\x07")), "is not a queue name"},
		{"priority out of range", edit(queue("priority", 1000)), "priority = 1000"},
		{"fractional gpus", edit(queue("gpus", 1.5)), "cannot unmarshal number 1.5"},
		{"duplicate queue", edit(func(m map[string]any) { m["queues"] = append(m["queues"].([]any), m["queues"].([]any)[0]) }), "declared twice"},
		{"escape sequence in applied_by", edit(func(m map[string]any) { m["applied_by"] = "root\x1b[2J" }), "applied_by"},
		{"bad sha256", edit(func(m map[string]any) { m["sha256"] = "abc" }), "sha256"},
		{"no applied_at", edit(func(m map[string]any) { delete(m, "applied_at") }), "no applied_at"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := s.Client.KV().Put(&api.KVPair{Key: s.Key(), Value: []byte(tc.value)}, nil); err != nil {
				t.Fatal(err)
			}
			r, idx, err := s.Read(ctx)
			var inv *InvalidError
			if r != nil || !errors.As(err, &inv) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("read %+v, %v; want an InvalidError saying %q", r, err, tc.want)
			}
			if !strings.Contains(err.Error(), "gpujob queue apply") || idx == 0 {
				t.Errorf("%v (index %d): want the fix and the index to overwrite it at", err, idx)
			}
		})
	}
	// Apply writes over a bad value at the index Read gave.
	_, idx, _ := s.Read(ctx)
	if _, err := s.Write(ctx, record(teamA), idx); err != nil {
		t.Fatal(err)
	}
	if r, _, err := s.Read(ctx); err != nil || r.Queues[0].Name != "team-a" {
		t.Fatalf("%+v %v", r, err)
	}
}

// Consul refuses a value over 512 KiB; Decode does too, before parsing.
func TestDecodeRefusesLarge(t *testing.T) {
	if _, err := Decode([]byte(`{"file":"` + strings.Repeat("x", MaxRecordBytes) + `"}`)); err == nil ||
		!strings.Contains(err.Error(), "a record is at most") {
		t.Fatal(err)
	}
}

// Write refuses what Read would: nothing invalid is ever stored.
func TestWriteRefusesInvalid(t *testing.T) {
	s := store(t)
	bad := record(Queue{Name: "a", GPUs: -1, Weight: 1, Priority: 50})
	if _, err := s.Write(context.Background(), bad, 0); err == nil || !strings.Contains(err.Error(), "gpus = -1") {
		t.Fatalf("write: %v", err)
	}
	if kv, _, _ := s.Client.KV().Get(s.Key(), nil); kv != nil {
		t.Fatalf("stored %s", kv.Value)
	}
}

// Watch delivers the configuration as it is and then each change,
// invalid values as errors.
func TestWatch(t *testing.T) {
	s := store(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type seen struct {
		r   *Record
		err error
	}
	got := make(chan seen, 10)
	go func() {
		_ = s.Watch(ctx, consul.WatchOptions{MinGap: -1}, func(r *Record, _ uint64, err error) error {
			got <- seen{r, err}
			return nil
		})
	}()
	next := func() seen {
		select {
		case v := <-got:
			return v
		case <-ctx.Done():
			t.Fatal("no delivery")
		}
		return seen{}
	}
	if v := next(); v.r != nil || v.err != nil {
		t.Fatalf("first: %+v", v)
	}
	if _, err := s.Write(ctx, record(teamA), 0); err != nil {
		t.Fatal(err)
	}
	if v := next(); v.err != nil || v.r == nil || v.r.Queues[0].Name != "team-a" {
		t.Fatalf("after apply: %+v", v)
	}
	if _, err := s.Client.KV().Put(&api.KVPair{Key: s.Key(), Value: []byte("{}")}, nil); err != nil {
		t.Fatal(err)
	}
	var inv *InvalidError
	if v := next(); v.r != nil || !errors.As(v.err, &inv) {
		t.Fatalf("after tampering: %+v", v)
	}
}
