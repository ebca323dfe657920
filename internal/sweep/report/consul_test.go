package report

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/consul"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
	"github.com/gpujob/gpujob/internal/testagent"
)

// consulAddr is the test agent's HTTP address ("" in -short).
var consulAddr string

// testTTL is the reporters' session TTL in these tests: the agent allows
// TTLs from 1s, so that a renewal that finds its session gone comes
// within a second.
const testTTL = 2 * time.Second

func TestMain(m *testing.M) {
	os.Exit(testagent.Main(m, `session_ttl_min = "1s"`, func(a *testagent.Consul) error {
		consulAddr = a.Addr
		return nil
	}))
}

// writeCounter counts the requests that write a key (PUT /v1/kv/…) and
// transactions, and the reads of keys.
type writeCounter struct {
	base   http.RoundTripper
	writes atomic.Int64
	bytes  atomic.Int64 // the writes' bodies
	reads  atomic.Int64
}

func (c *writeCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	switch {
	case req.Method == http.MethodPut && (strings.HasPrefix(req.URL.Path, "/v1/kv/") || req.URL.Path == "/v1/txn"):
		c.writes.Add(1)
		c.bytes.Add(max(req.ContentLength, 0))
	case req.Method == http.MethodGet && strings.HasPrefix(req.URL.Path, "/v1/kv/"):
		c.reads.Add(1)
	}
	return c.base.RoundTrip(req)
}

// client is a Consul client of the test agent; with a counter, its writes
// are counted.
func client(t *testing.T, count *writeCounter) *api.Client {
	t.Helper()
	if consulAddr == "" {
		t.Skip("needs a Consul agent (not in -short)")
	}
	cfg := api.DefaultConfig()
	cfg.Address = consulAddr
	if count != nil {
		count.base = &http.Transport{}
		cfg.HttpClient = &http.Client{Transport: count}
	}
	c, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// trialKeys are a fresh trial's keys, one trial per test: what an earlier
// run of the test (-count) left is deleted, and so is what this one leaves.
func trialKeys(t *testing.T, c *api.Client) (metrics, stop string) {
	t.Helper()
	name := strings.NewReplacer("/", "-", " ", "-").Replace(t.Name())
	clear := func() {
		// The other trials some tests add are "<name>-other<i>".
		if _, err := c.KV().DeleteTree(sweepkv.TrialKey(sweepkv.DefaultPrefix, "default", "sweep", name), nil); err != nil {
			t.Error(err)
		}
	}
	clear()
	t.Cleanup(clear)
	return sweepkv.MetricsKey(sweepkv.DefaultPrefix, "default", "sweep", name), sweepkv.StopKey(sweepkv.DefaultPrefix, "default", "sweep", name)
}

func start(t *testing.T, c *api.Client, key string) *Reporter {
	t.Helper()
	r, err := Start(Config{Client: c, Key: key, SessionTTL: testTTL, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	return r
}

// waitFor polls cond (reading Consul) every 20 ms for up to limit.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func get(t *testing.T, c *api.Client, key string) (*api.KVPair, sweepkv.Metrics) {
	t.Helper()
	pair, _, err := c.KV().Get(key, nil)
	if err != nil {
		t.Fatal(err)
	}
	if pair == nil {
		return nil, sweepkv.Metrics{}
	}
	var m sweepkv.Metrics
	if err := json.Unmarshal(pair.Value, &m); err != nil {
		t.Fatalf("the record %s does not decode: %v", pair.Value, err)
	}
	return pair, m
}

func TestRecordHeldBySessionWhileLiveAndReleasedOnClose(t *testing.T) {
	c := client(t, nil)
	key, _ := trialKeys(t, c)
	r := start(t, c, key)
	// The record shows a live supervisor before any line.
	var pair *api.KVPair
	waitFor(t, 5*time.Second, "the record taken", func() bool { pair, _ = get(t, c, key); return pair != nil && pair.Session != "" })
	info, _, err := c.Session().Info(pair.Session, nil)
	if err != nil || info == nil {
		t.Fatalf("session %s: %+v, %v", pair.Session, info, err)
	}
	if info.Behavior != api.SessionBehaviorRelease || info.LockDelay != 0 || info.TTL != testTTL.String() {
		t.Errorf("session behavior %q lock delay %s TTL %s, want release, 0 and %s", info.Behavior, info.LockDelay, info.TTL, testTTL)
	}
	r.Line(`gpujob-metric: {"step": 1, "loss": 2}`)
	r.Line(`gpujob-metric: {"step": 2, "loss": 1}`)
	// Past several TTLs: the session is renewed.
	time.Sleep(3 * testTTL)
	if pair, _ = get(t, c, key); pair == nil || pair.Session != info.ID {
		t.Fatalf("after %s the record is %+v, want it held by %s", 3*testTTL, pair, info.ID)
	}
	if err := r.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	pair, m := get(t, c, key)
	if pair == nil || pair.Session != "" {
		t.Fatalf("after Close the record is %+v, want it kept without a session", pair)
	}
	if steps(m) != "1 2" || m.Updated.IsZero() {
		t.Errorf("after Close the record has steps %q, updated %v", steps(m), m.Updated)
	}
	if info, _, _ := c.Session().Info(info.ID, nil); info != nil {
		t.Errorf("session %s outlived Close", info.ID)
	}
	r.Line(`gpujob-metric: {"step": 3, "loss": 1}`) // after Close: dropped, no panic
}

func TestRecordReleasedWhenTheSessionEndsAndTakenAgain(t *testing.T) {
	c := client(t, nil)
	key, _ := trialKeys(t, c)
	r := start(t, c, key)
	var pair *api.KVPair
	waitFor(t, 5*time.Second, "the record taken", func() bool { pair, _ = get(t, c, key); return pair != nil && pair.Session != "" })
	// As Consul does when the supervisor's node fails.
	if _, err := c.Session().Destroy(pair.Session, nil); err != nil {
		t.Fatal(err)
	}
	if p, _ := get(t, c, key); p == nil || p.Session != "" {
		t.Fatalf("the record after its session ended: %+v, want it kept without a session", p)
	}
	old := pair.Session
	// The reporter notices at its next renewal (TTL/2) and takes it again.
	waitFor(t, 3*testTTL, "the record taken again", func() bool {
		pair, _ = get(t, c, key)
		return pair != nil && pair.Session != "" && pair.Session != old
	})
	r.Line(`gpujob-metric: {"step": 7, "loss": 1}`)
	waitFor(t, 3*time.Second, "a point written under the new session", func() bool {
		_, m := get(t, c, key)
		return steps(m) == "7"
	})
}

func TestAtMostAboutOneWritePerSecond(t *testing.T) {
	count := &writeCounter{}
	c := client(t, count)
	key, _ := trialKeys(t, c)
	r := start(t, c, key)
	w := r.Writer()
	const flood = 3 * time.Second
	began := time.Now()
	step := 0
	for time.Since(began) < flood {
		step++
		fmt.Fprintf(w, "step %d: some other output\ngpujob-metric: {\"step\": %d, \"loss\": %g}\n", step, step, 1/float64(step))
		if step%100 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	writes := count.writes.Load()
	// The takeover, then one per second of the flood (the first may come
	// at once), with one of slack for timing.
	if limit := int64(flood/time.Second) + 2; writes > limit {
		t.Errorf("%d writes for %d lines in %s, want at most %d", writes, step, flood, limit)
	}
	if writes < 2 {
		t.Errorf("%d writes in %s: the reporter does not write while lines come", writes, flood)
	}
	// The record lags by at most about a second.
	_, m := get(t, c, key)
	if len(m.Points) == 0 {
		t.Fatal("nothing written during the flood")
	}
	fmt.Fprintf(w, "gpujob-result: {\"accuracy\": 0.9}\n")
	if err := r.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, m = get(t, c, key)
	last := m.Points[len(m.Points)-1]
	if last.Step != step || !last.Final || last.Values["accuracy"] != 0.9 || len(m.Points) > sweepkv.MaxPoints {
		t.Errorf("final record: %d points, last %+v; want the result merged into step %d", len(m.Points), last, step)
	}
	t.Logf("%d lines, %d writes", step, count.writes.Load())
}

func TestResumesAnExistingRecord(t *testing.T) {
	c := client(t, nil)
	key, _ := trialKeys(t, c)
	old := sweepkv.Metrics{Points: []sweepkv.Point{pt(10, 1), pt(20, 1), pt(30, 1)}, Rewinds: 1}
	b, _ := json.Marshal(old)
	if _, err := c.KV().Put(&api.KVPair{Key: key, Value: b}, nil); err != nil {
		t.Fatal(err)
	}
	r := start(t, c, key)
	// The trial resumed from its checkpoint at step 20 (a line may come
	// before or after the takeover: the same record results).
	r.Line(`gpujob-metric: {"step": 20, "v": 2}`)
	waitFor(t, 5*time.Second, "the record resumed", func() bool {
		pair, _ := get(t, c, key)
		return pair != nil && pair.Session != ""
	})
	r.Line(`gpujob-metric: {"step": 25, "v": 2}`)
	if err := r.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, m := get(t, c, key)
	if steps(m) != "10 20 25" || m.Rewinds != 2 || m.Points[1].Values["v"] != 2 {
		t.Fatalf("resumed record: steps %q rewinds %d points %+v; want 10 20 25 with 2 rewinds", steps(m), m.Rewinds, m.Points)
	}
}

func TestWaitsForAnEarlierSupervisorsSession(t *testing.T) {
	c := client(t, nil)
	key, _ := trialKeys(t, c)
	// An earlier supervisor of the trial, still holding the record with
	// a session like a reporter's.
	s, err := consul.NewSession(context.Background(), c, sessionOptions("earlier", 10*time.Second, nil))
	if err != nil {
		t.Fatal(err)
	}
	s.StopRenewing()
	earlier := s.ID()
	b, _ := json.Marshal(sweepkv.Metrics{Points: []sweepkv.Point{pt(1, 1), pt(2, 1)}})
	if ok, _, err := c.KV().Acquire(&api.KVPair{Key: key, Value: b, Session: earlier}, nil); !ok || err != nil {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	r := start(t, c, key)
	r.Line(`gpujob-metric: {"step": 3, "v": 2}`)
	time.Sleep(1500 * time.Millisecond)
	if pair, m := get(t, c, key); pair.Session != earlier || steps(m) != "1 2" {
		t.Fatalf("the reporter wrote over a record another session holds: %+v %q", pair, steps(m))
	}
	if _, err := c.Session().Destroy(earlier, nil); err != nil {
		t.Fatal(err)
	}
	// It waits in a blocking query on the record: the takeover follows at once.
	waitFor(t, time.Second, "the record taken over", func() bool {
		pair, m := get(t, c, key)
		return pair.Session != "" && pair.Session != earlier && steps(m) == "1 2 3"
	})
}

func TestCloseWithoutConsulGivesUpWithItsContext(t *testing.T) {
	cfg := api.DefaultConfig()
	cfg.Address = "127.0.0.1:1" // nothing listens
	c, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var logged []string
	r, err := Start(Config{Client: c, Key: "gpujob/sweeps/default/s/trials/t/metrics", Logf: func(f string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		logged = append(logged, fmt.Sprintf(f, a...))
	}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1000 {
		r.Line(fmt.Sprintf(`gpujob-metric: {"step": %d, "v": 1}`, i))
	}
	time.Sleep(time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	began := time.Now()
	if err := r.Close(ctx); err == nil {
		t.Fatal("Close without Consul returned no error")
	}
	if d := time.Since(began); d > 2*time.Second {
		t.Errorf("Close took %s with a 300ms context", d)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(logged) == 0 || len(logged) > 3 {
		t.Errorf("a second of failures logged %d lines, want one or two: %q", len(logged), logged)
	}
}

func TestWatchStopFiresOnce(t *testing.T) {
	c := client(t, nil)
	key, stopKey := trialKeys(t, c)
	// The trial's own reporter writes beside the stop key meanwhile.
	r := start(t, c, key)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan sweepkv.StopRequest, 2)
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		WatchStop(ctx, c, stopKey, t.Logf, func(req sweepkv.StopRequest) { got <- req })
	}()
	for i := range 10 {
		r.Line(fmt.Sprintf(`gpujob-metric: {"step": %d, "v": 1}`, i))
		time.Sleep(100 * time.Millisecond)
	}
	select {
	case req := <-got:
		t.Fatalf("stopped without a request: %+v", req)
	default:
	}
	want := sweepkv.StopRequest{Reason: "stopped by ASHA at step 120: 0.71 < rung cut 0.78", At: time.Now().UTC().Round(0)}
	b, _ := json.Marshal(want)
	if _, err := c.KV().Put(&api.KVPair{Key: stopKey, Value: b}, nil); err != nil {
		t.Fatal(err)
	}
	put := time.Now()
	select {
	case req := <-got:
		if d := time.Since(put); d > time.Second {
			t.Errorf("the stop came %s after the request", d)
		}
		if req.Reason != want.Reason || !req.At.Equal(want.At) {
			t.Errorf("request %+v, want %+v", req, want)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("no stop within 2s of the request")
	}
	select {
	case <-returned:
	case <-time.After(time.Second):
		t.Fatal("WatchStop did not return after the stop")
	}
	if len(got) != 0 {
		t.Error("stop called twice")
	}

	// A request already there is seen at once; ReadStop reads it too.
	ctx2, cancel2 := context.WithTimeout(context.Background(), time.Second)
	defer cancel2()
	fired := false
	WatchStop(ctx2, c, stopKey, t.Logf, func(sweepkv.StopRequest) { fired = true })
	if !fired {
		t.Error("an existing request did not fire")
	}
	if req, found, err := ReadStop(ctx2, c, stopKey); err != nil || !found || req.Reason != want.Reason {
		t.Errorf("ReadStop: %+v %v %v", req, found, err)
	}
}

// The watch waits: the writes of every trial of the sweep, its own trial's
// included, do not wake it.
func TestWatchStopIgnoresOtherTrialsWrites(t *testing.T) {
	c := client(t, nil)
	key, stopKey := trialKeys(t, c)
	own := start(t, c, key)
	var others []*Reporter
	var otherKeys []string
	for i := range 4 {
		other := sweepkv.MetricsKey(sweepkv.DefaultPrefix, "default", "sweep", fmt.Sprintf("%s-other%d", t.Name(), i))
		otherKeys = append(otherKeys, other)
		others = append(others, start(t, c, other))
		others[i].Line(`gpujob-metric: {"step": 0, "v": 1}`)
	}
	own.Line(`gpujob-metric: {"step": 0, "v": 1}`)
	// Every record taken (the takeovers are writes the watch must not
	// count).
	waitFor(t, 5*time.Second, "not every record was taken", func() bool {
		for _, k := range append(otherKeys, key) {
			if p, _, err := c.KV().Get(k, nil); err != nil || p == nil || p.Session == "" {
				return false
			}
		}
		return true
	})
	count := &writeCounter{}
	wc := client(t, count)
	ctx, cancel := context.WithCancel(context.Background())
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		WatchStop(ctx, wc, stopKey, t.Logf, func(sweepkv.StopRequest) { t.Error("stopped without a request") })
	}()
	const d = 3 * time.Second
	for began := time.Now(); time.Since(began) < d; time.Sleep(20 * time.Millisecond) {
		for i, r := range append(others, own) {
			r.Line(fmt.Sprintf(`gpujob-metric: {"step": %d, "v": %d}`, int(time.Since(began)/time.Millisecond), i))
		}
	}
	cancel()
	<-returned
	// One query to start and the one waiting; one of slack.
	if n := count.reads.Load(); n > 3 {
		t.Errorf("the watch made %d requests in %s while 5 trials wrote", n, d)
	}
}

func TestWatchStopEndsWithItsContext(t *testing.T) {
	c := client(t, nil)
	_, stopKey := trialKeys(t, c)
	if _, found, err := ReadStop(context.Background(), c, stopKey); found || err != nil {
		t.Fatalf("ReadStop of no request: %v %v", found, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		WatchStop(ctx, c, stopKey, t.Logf, func(sweepkv.StopRequest) { t.Error("stopped without a request") })
	}()
	time.Sleep(200 * time.Millisecond)
	cancel()
	select {
	case <-returned:
	case <-time.After(time.Second):
		t.Fatal("WatchStop outlived its context")
	}
}

func TestDecodeStop(t *testing.T) {
	tests := []struct {
		value string
		want  string
	}{
		{`{"reason": "goal reached", "at": "2026-12-02T10:00:00Z"}`, "goal reached"},
		{`{"reason": ""}`, "stopped by the sweep"},
		{`{"reason": "two\nlines\tand a bell\u0007"}`, "two lines and a bell"},
		{`{"reason": "` + strings.Repeat("é", maxReasonLen) + `"}`, strings.Repeat("é", maxReasonLen/2) + "…"},
		{`stop`, "stopped by the sweep (the request at k does not decode: invalid character 's' looking for beginning of value)"},
	}
	for _, tt := range tests {
		if got := decodeStop(&api.KVPair{Key: "k", Value: []byte(tt.value)}); got.Reason != tt.want {
			t.Errorf("decodeStop(%q) = %q, want %q", tt.value, got.Reason, tt.want)
		}
	}
}

// A result is written at once, not at the end of the write interval: with
// an interval of a minute, once the record is taken over a metric waits
// for the interval, while a result written after it brings both into
// Consul within seconds.
func TestResultSkipsTheInterval(t *testing.T) {
	c := client(t, nil)
	key, _ := trialKeys(t, c)
	r, err := Start(Config{Client: c, Key: key, SessionTTL: testTTL, Logf: t.Logf, Interval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	// The takeover is the first write and starts the minute; whether a
	// point printed at once makes it is a race, so wait for it first.
	waitFor(t, 20*time.Second, "the record taken over", func() bool {
		pair, _ := get(t, c, key)
		return pair != nil && pair.Session != ""
	})
	if _, m := get(t, c, key); len(m.Points) != 0 {
		t.Fatalf("points before any were printed: %+v", m.Points)
	}
	w := r.Writer()
	fmt.Fprintf(w, "gpujob-metric: {\"step\": 1, \"loss\": 0.5}\n")
	time.Sleep(time.Second)
	if _, m := get(t, c, key); len(m.Points) != 0 {
		t.Fatalf("a metric was written before the interval ended: %+v", m.Points)
	}
	fmt.Fprintf(w, "gpujob-metric: {\"step\": 2, \"loss\": 0.4}\ngpujob-result: {\"accuracy\": 0.9}\n")
	// Far below the minute the metrics wait, and room for a loaded machine.
	waitFor(t, 20*time.Second, "the result written", func() bool {
		_, m := get(t, c, key)
		return len(m.Points) > 0 && m.Points[len(m.Points)-1].Final
	})
	// The result joins step 2's point; the step-1 metric that waited
	// goes with it.
	if _, m := get(t, c, key); len(m.Points) != 2 || m.Points[0].Step != 1 {
		t.Errorf("the result's write has points %+v, want step 1's metric and step 2 with the result", m.Points)
	}
}
