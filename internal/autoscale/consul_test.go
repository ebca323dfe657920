package autoscale

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpujob/gpujob/internal/servekv"
	"github.com/gpujob/gpujob/internal/testagent"
	consulapi "github.com/hashicorp/consul/api"
)

// consulAddr is the dev agent all the package's Consul tests share (each
// under prefixes of its own); empty with -short.
var consulAddr string

func TestMain(m *testing.M) {
	os.Exit(testagent.Main(m, "", func(a *testagent.Consul) error {
		consulAddr = a.Addr
		return nil
	}))
}

func newClient(t *testing.T) *consulapi.Client {
	t.Helper()
	if consulAddr == "" {
		t.Skip("needs a Consul agent (not with -short)")
	}
	c, err := consulapi.NewClient(&consulapi.Config{Address: consulAddr})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// testPrefixes are a test's own services' and gateways' trees.
func testPrefixes(t *testing.T) (prefix, gwPrefix string) {
	base := "test/" + strings.ReplaceAll(t.Name(), "/", "_")
	return base + "/services", base + "/gateway"
}

// runBg runs fn until the returned stop is called (or the test ends) and
// stop waits for it to return, failing the test if that takes longer than
// limit.
func runBg(t *testing.T, limit time.Duration, fn func(ctx context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run returned %v", err)
				}
			case <-time.After(limit):
				t.Errorf("Run did not return within %s of its context ending", limit)
				<-done
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// logTo logs to t while the test runs and nowhere after (a goroutine
// logging to a finished test panics).
func logTo(t *testing.T) func(string, ...any) {
	var mu sync.Mutex
	done := false
	t.Cleanup(func() { mu.Lock(); done = true; mu.Unlock() })
	return func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if !done {
			t.Logf(format, args...)
		}
	}
}

// eventually polls cond every 20 ms until it holds or limit passes.
func eventually(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", limit, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sessionsNamed lists the Consul sessions whose name starts with prefix.
func sessionsNamed(t *testing.T, c *consulapi.Client, prefix string) []*consulapi.SessionEntry {
	t.Helper()
	all, _, err := c.Session().List(nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []*consulapi.SessionEntry
	for _, s := range all {
		if strings.HasPrefix(s.Name, prefix) {
			out = append(out, s)
		}
	}
	return out
}

func putJSON(t *testing.T, c *consulapi.Client, key string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.KV().Put(&consulapi.KVPair{Key: key, Value: b}, nil); err != nil {
		t.Fatal(err)
	}
}

// loadBox is a gateway's load as its data plane would give it to a
// Reporter, counting the snapshots taken.
type loadBox struct {
	mu        sync.Mutex
	inflight  map[string]int
	queued    map[string]int
	snapshots int
}

func (b *loadBox) set(name string, inflight, queued int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inflight == nil {
		b.inflight, b.queued = map[string]int{}, map[string]int{}
	}
	b.inflight[name], b.queued[name] = inflight, queued
}

func (b *loadBox) snapshot() servekv.Load {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.snapshots++
	l := servekv.Load{Inflight: map[string]int{}, Queued: map[string]int{}, Updated: time.Now()}
	for k, v := range b.inflight {
		l.Inflight[k] = v
	}
	for k, v := range b.queued {
		l.Queued[k] = v
	}
	return l
}

func (b *loadBox) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.snapshots
}
