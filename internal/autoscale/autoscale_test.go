package autoscale

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpujob/gpujob/internal/servekv"
	consulapi "github.com/hashicorp/consul/api"
)

// requestHook shows every request to seen before sending it.
type requestHook struct {
	base http.RoundTripper
	seen func(*http.Request)
}

func (h *requestHook) RoundTrip(r *http.Request) (*http.Response, error) {
	h.seen(r)
	return h.base.RoundTrip(r)
}

// fakeNomad keeps task groups' counts and records the autoscalers' calls.
type fakeNomad struct {
	mu        sync.Mutex
	counts    map[string]int               // "<ns>/<job>/<group>"
	metas     map[string]map[string]string // "<ns>/<job>": its meta, when set; else it claims the service named like it
	reads     map[string]int               // Group calls by "<ns>/<job>"
	calls     []scaleCall
	failScale int // the next failScale Scale calls fail
	busyScale int // the next busyScale Scale calls meet a deployment (ErrBusy)
}

type scaleCall struct {
	by, namespace, job, group string
	count                     int
	reason                    string
	err                       error
}

func (n *fakeNomad) scaler(by string) Scaler { return fakeScaler{n: n, by: by} }

func (n *fakeNomad) set(ns, job, group string, count int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.counts == nil {
		n.counts = map[string]int{}
	}
	n.counts[ns+"/"+job+"/"+group] = count
}

func (n *fakeNomad) snapshot() []scaleCall {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]scaleCall(nil), n.calls...)
}

// waitScaled waits for a successful Scale to count and returns it.
func (n *fakeNomad) waitScaled(t *testing.T, limit time.Duration, count int) scaleCall {
	t.Helper()
	var got scaleCall
	eventually(t, limit, fmt.Sprintf("no Scale to %d; calls: %+v", count, n.snapshot()), func() bool {
		for _, c := range n.snapshot() {
			if c.count == count && c.err == nil {
				got = c
				return true
			}
		}
		return false
	})
	return got
}

type fakeScaler struct {
	n  *fakeNomad
	by string
}

// claimMeta is the meta of a job deployed as service ns/svc with group.
func claimMeta(ns, svc, job, group string) map[string]string {
	b, _ := json.Marshal(servekv.Route{Namespace: ns, Service: svc, JobID: job, Group: group})
	return map[string]string{servekv.JobMetaKind: servekv.JobKindService, servekv.JobMetaRoute: string(b)}
}

// setMeta gives a job meta of its own (a job that is not the service named
// like it).
func (n *fakeNomad) setMeta(ns, job string, meta map[string]string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.metas == nil {
		n.metas = map[string]map[string]string{}
	}
	n.metas[ns+"/"+job] = meta
}

func (f fakeScaler) Group(ctx context.Context, ns, job, group string) (Group, error) {
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	if f.n.reads == nil {
		f.n.reads = map[string]int{}
	}
	f.n.reads[ns+"/"+job]++
	c, ok := f.n.counts[ns+"/"+job+"/"+group]
	if !ok {
		return Group{}, fmt.Errorf("job %s/%s has no group %s", ns, job, group)
	}
	meta, ok := f.n.metas[ns+"/"+job]
	if !ok {
		meta = claimMeta(ns, job, job, group)
	}
	return Group{Count: c, JobNamespace: ns, Meta: meta}, nil
}

func (f fakeScaler) Scale(ctx context.Context, ns, job, group string, count int, reason string) error {
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	call := scaleCall{by: f.by, namespace: ns, job: job, group: group, count: count, reason: reason}
	if f.n.failScale > 0 {
		f.n.failScale--
		call.err = errors.New("nomad is unavailable")
	} else if f.n.busyScale > 0 {
		f.n.busyScale--
		call.err = fmt.Errorf("%w: job scaling blocked due to active deployment", ErrBusy)
	} else {
		f.n.counts[ns+"/"+job+"/"+group] = count
	}
	f.n.calls = append(f.n.calls, call)
	return call.err
}

// writeRoutes writes the autoscaled service team/bert (job bert, group
// serve) with as, and beside it what the autoscaler must leave alone: a
// route without autoscale, a route that is not JSON, and a token.
func writeRoutes(t *testing.T, c *consulapi.Client, prefix string, as servekv.Autoscale) {
	t.Helper()
	putJSON(t, c, servekv.RouteKey(prefix, "team", "bert"), servekv.Route{
		Namespace: "team", Service: "bert", ConsulService: "gpujob-team-bert", Tag: "gpujob-ns=team",
		PathPrefix: "/bert", JobID: "bert", Group: "serve", Autoscale: &as,
	})
	putJSON(t, c, servekv.RouteKey(prefix, "team", "plain"), servekv.Route{
		Namespace: "team", Service: "plain", PathPrefix: "/plain", JobID: "plain", Group: "serve",
	})
	if _, err := c.KV().Put(&consulapi.KVPair{Key: servekv.RouteKey(prefix, "team", "broken"), Value: []byte("{")}, nil); err != nil {
		t.Fatal(err)
	}
	putJSON(t, c, servekv.TokenKey(prefix, "team", "bert", servekv.HashSecret("s")), servekv.Token{ID: "x"})
}

func newAutoscaler(t *testing.T, c *consulapi.Client, prefix, gw, id string, s Scaler) *Autoscaler {
	t.Helper()
	a, err := New(Config{Consul: c, Prefix: prefix, GatewayPrefix: gw, ID: id, Scaler: s,
		Logf: logTo(t), Tick: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestAutoscalerScalesUpAndDown(t *testing.T) {
	c := newClient(t)
	prefix, gw := testPrefixes(t)
	writeRoutes(t, c, prefix, servekv.Autoscale{Min: 0, Max: 3, TargetInflight: 2,
		ScaleDownDelay: servekv.Duration(time.Second)})
	nomad := &fakeNomad{failScale: 1} // the first Scale fails and is retried
	nomad.set("team", "bert", "serve", 0)
	nomad.set("team", "plain", "serve", 1)

	bert := servekv.LoadName("team", "bert")
	box := &loadBox{}
	box.set(bert, 5, 0)
	box.set(servekv.LoadName("team", "plain"), 9, 0)
	rep := NewReporter(c, gw, "gw-a", box.snapshot, 200*time.Millisecond)
	rep.Logf = logTo(t)
	stopReporter := runBg(t, 5*time.Second, rep.Run)

	a := newAutoscaler(t, c, prefix, gw, "gw-a", nomad.scaler("gw-a"))
	stop := runBg(t, 5*time.Second, a.Run)

	up := nomad.waitScaled(t, 5*time.Second, 3)
	if up.namespace != "team" || up.job != "bert" || up.group != "serve" {
		t.Errorf("scaled %s/%s group %s, want team/bert group serve", up.namespace, up.job, up.group)
	}
	if want := "5 requests in flight across 1 gateway, target 2 per replica: 0 → 3 replicas"; up.reason != want {
		t.Errorf("reason %q, want %q", up.reason, want)
	}
	calls := nomad.snapshot()
	if len(calls) < 2 || calls[0].err == nil || calls[0].count != 3 {
		t.Errorf("calls %+v: want a failed Scale to 3, then a retry", calls)
	}
	if !a.IsLeader() {
		t.Error("the only autoscaler is not the leader")
	}

	// Steady load: a few ticks pass without a call.
	n := len(nomad.snapshot())
	time.Sleep(500 * time.Millisecond)
	if calls := nomad.snapshot(); len(calls) != n {
		t.Errorf("Scale called again with nothing changed: %+v", calls[n:])
	}
	// Someone scales the group by hand: the autoscaler reads Nomad's count
	// rather than trusting its own, and puts it back.
	nomad.set("team", "bert", "serve", 1)
	eventually(t, 3*time.Second, "the count changed by hand was not put back", func() bool {
		calls := nomad.snapshot()
		return len(calls) > n && calls[len(calls)-1].count == 3 &&
			strings.HasSuffix(calls[len(calls)-1].reason, ": 1 → 3 replicas")
	})

	// No load: down to 0, but only after ScaleDownDelay.
	box.set(bert, 0, 0)
	idle := time.Now()
	rep.Kick()
	nomad.waitScaled(t, 5*time.Second, 0)
	if d := time.Since(idle); d < time.Second {
		t.Errorf("scaled down %s after the load went, want at least the 1s delay", d)
	}

	// A request queued with no replica: back up to 1 at once.
	box.set(bert, 0, 1)
	queued := time.Now()
	rep.Kick()
	nomad.waitScaled(t, 2*time.Second, 1)
	t.Logf("scale from zero %s after a request was queued", time.Since(queued))

	for _, call := range nomad.snapshot() {
		if call.job != "bert" {
			t.Errorf("scaled a service that does not autoscale: %+v", call)
		}
	}
	stop()
	if a.IsLeader() {
		t.Error("IsLeader after Run returned")
	}
	stopReporter()
	if p, _, err := c.KV().Get(servekv.LeaderKey(gw), nil); err != nil || (p != nil && p.Session != "") {
		t.Errorf("after Run returned the lock is %+v (err %v), want released", p, err)
	}
	if s, _, err := c.Session().List(nil); err != nil || len(s) != 0 {
		t.Errorf("after Run returned: sessions %v (err %v), want none", s, err)
	}
}

func TestAutoscalerFailsOverToAnotherGateway(t *testing.T) {
	c := newClient(t)
	prefix, gw := testPrefixes(t)
	writeRoutes(t, c, prefix, servekv.Autoscale{Min: 0, Max: 3, TargetInflight: 2,
		ScaleDownDelay: servekv.Duration(time.Second)})
	nomad := &fakeNomad{}
	nomad.set("team", "bert", "serve", 0)
	bert := servekv.LoadName("team", "bert")
	box := &loadBox{}
	rep := NewReporter(c, gw, "gw-a", box.snapshot, 200*time.Millisecond)
	rep.Logf = logTo(t)
	stopReporter := runBg(t, 5*time.Second, rep.Run)

	as := map[string]*Autoscaler{}
	stops := map[string]func(){}
	for _, id := range []string{"gw-a", "gw-b"} {
		as[id] = newAutoscaler(t, c, prefix, gw, id, nomad.scaler(id))
		// One that does not lead stops waiting for the lock as soon as
		// its context ends.
		stops[id] = runBg(t, 3*time.Second, as[id].Run)
	}
	leader := func() string {
		var ids []string
		for id, a := range as {
			if a.IsLeader() {
				ids = append(ids, id)
			}
		}
		if len(ids) > 1 {
			t.Fatalf("two leaders: %v", ids)
		}
		if len(ids) == 0 {
			return ""
		}
		return ids[0]
	}
	eventually(t, 5*time.Second, "no autoscaler leads", func() bool { return leader() != "" })
	// Only one leads, and stays so.
	first := leader()
	for i := 0; i < 10; i++ {
		if l := leader(); l != first {
			t.Fatalf("leader changed from %s to %q with nothing stopped", first, l)
		}
		time.Sleep(30 * time.Millisecond)
	}
	p, _, err := c.KV().Get(servekv.LeaderKey(gw), nil)
	if err != nil || p == nil || string(p.Value) != first {
		t.Fatalf("the lock's value is %v (err %v), want %q", p, err, first)
	}

	box.set(bert, 5, 0)
	rep.Kick()
	nomad.waitScaled(t, 5*time.Second, 3)
	for _, call := range nomad.snapshot() {
		if call.by != first {
			t.Errorf("%s scaled while %s leads: %+v", call.by, first, call)
		}
	}

	// The leader stops; the other takes over and acts on the next change.
	stopped := time.Now()
	stops[first]()
	t.Logf("the leader stepped down in %s", time.Since(stopped))
	second := "gw-a"
	if first == "gw-a" {
		second = "gw-b"
	}
	box.set(bert, 2, 0) // wants 1 replica
	rep.Kick()
	down := nomad.waitScaled(t, 6*time.Second, 1)
	if down.by != second {
		t.Errorf("the scale to 1 was by %s, want %s", down.by, second)
	}
	if !as[second].IsLeader() || as[first].IsLeader() {
		t.Errorf("leaders after the failover: %s %v, %s %v", first, as[first].IsLeader(), second, as[second].IsLeader())
	}
	t.Logf("took over and scaled %s after the leader stopped", time.Since(stopped))

	stops[second]()
	stopReporter()
	if s, _, err := c.Session().List(nil); err != nil || len(s) != 0 {
		names := []string{}
		for _, e := range s {
			names = append(names, e.Name)
		}
		t.Errorf("after both stopped: sessions %s (err %v), want none", strings.Join(names, ", "), err)
	}
}

// TestAutoscalerKeepsCampaigningAfterLosingItsSession destroys the
// leader's session from outside (its TTL ran out in an outage): Consul
// releases the lock, the autoscaler stops acting, makes a new session and
// leads again.
func TestAutoscalerKeepsCampaigningAfterLosingItsSession(t *testing.T) {
	c := newClient(t)
	prefix, gw := testPrefixes(t)
	nomad := &fakeNomad{}
	a := newAutoscaler(t, c, prefix, gw, "gw-a", nomad.scaler("gw-a"))
	runBg(t, 5*time.Second, a.Run)

	var first string
	eventually(t, 5*time.Second, "no lock taken", func() bool {
		p, _, err := c.KV().Get(servekv.LeaderKey(gw), nil)
		if err == nil && p != nil {
			first = p.Session
		}
		return first != "" && a.IsLeader()
	})
	if _, err := c.Session().Destroy(first, nil); err != nil {
		t.Fatal(err)
	}
	// Losing the lock has the session checked at once (not at the next
	// renewal, TTL/2 away), and there is no lock delay to wait out.
	eventually(t, 3*time.Second, "did not lead again under a new session", func() bool {
		p, _, err := c.KV().Get(servekv.LeaderKey(gw), nil)
		return err == nil && p != nil && p.Session != "" && p.Session != first && a.IsLeader()
	})
	if s := sessionsNamed(t, c, LockSessionName); len(s) != 1 {
		t.Errorf("%d autoscaler sessions, want the new one only", len(s))
	}
}

// TestAutoscalerDoesNotActWithoutTheLock holds the lock from outside: the
// autoscaler waits without scaling, and when stopped returns at once,
// leaving no session. The outside holder is consulapi.Lock, as in gateways
// of the previous release: the two must exclude each other.
func TestAutoscalerDoesNotActWithoutTheLock(t *testing.T) {
	c := newClient(t)
	prefix, gw := testPrefixes(t)
	writeRoutes(t, c, prefix, servekv.Autoscale{Max: 3, TargetInflight: 1})
	putJSON(t, c, servekv.LoadKey(gw, "gw-x"), servekv.Load{Gateway: "gw-x",
		Inflight: map[string]int{servekv.LoadName("team", "bert"): 3}, Updated: time.Now()})
	nomad := &fakeNomad{}
	nomad.set("team", "bert", "serve", 0)

	other, err := c.LockOpts(&consulapi.LockOptions{Key: servekv.LeaderKey(gw), SessionName: "other", SessionTTL: "10s"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Lock(nil); err != nil {
		t.Fatal(err)
	}
	defer other.Unlock()

	// The autoscaler's client says when it waits in a blocking query on
	// the held lock key: it has seen the holder and decided to wait.
	waiting := make(chan struct{})
	var once sync.Once
	leaderPath := "/v1/kv/" + servekv.LeaderKey(gw)
	wc, err := consulapi.NewClient(&consulapi.Config{Address: consulAddr, HttpClient: &http.Client{Transport: &requestHook{
		base: &http.Transport{},
		seen: func(r *http.Request) {
			if i := r.URL.Query().Get("index"); r.Method == http.MethodGet && r.URL.Path == leaderPath && i != "" && i != "0" {
				once.Do(func() { close(waiting) })
			}
		},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	a := newAutoscaler(t, wc, prefix, gw, "gw-a", nomad.scaler("gw-a"))
	stop := runBg(t, 2*time.Second, a.Run)
	select {
	case <-waiting:
	case <-time.After(5 * time.Second):
		t.Fatal("the autoscaler never waited for the held lock")
	}
	if a.IsLeader() {
		t.Error("leads while another holds the lock")
	}
	if calls := nomad.snapshot(); len(calls) != 0 {
		t.Errorf("scaled without the lock: %+v", calls)
	}
	stopped := time.Now()
	stop()
	t.Logf("a waiting autoscaler stopped in %s", time.Since(stopped))
	if s := sessionsNamed(t, c, LockSessionName); len(s) != 0 {
		t.Errorf("%d autoscaler sessions left after Run returned", len(s))
	}
}

// While a deployment runs, Nomad refuses to scale: the autoscaler waits
// (busyRetry) instead of asking again every half tick.
func TestAutoscalerWaitsForADeployment(t *testing.T) {
	c := newClient(t)
	prefix, gw := testPrefixes(t)
	writeRoutes(t, c, prefix, servekv.Autoscale{Min: 0, Max: 3, TargetInflight: 2})
	nomad := &fakeNomad{busyScale: 1}
	nomad.set("team", "bert", "serve", 1)
	nomad.set("team", "plain", "serve", 1)
	box := &loadBox{}
	box.set(servekv.LoadName("team", "bert"), 6, 0)
	rep := NewReporter(c, gw, "gw-a", box.snapshot, 100*time.Millisecond)
	rep.Logf = logTo(t)
	stopReporter := runBg(t, 5*time.Second, rep.Run)
	defer stopReporter()
	a := newAutoscaler(t, c, prefix, gw, "gw-a", nomad.scaler("gw-a"))
	stop := runBg(t, 5*time.Second, a.Run)
	defer stop()
	start := time.Now()
	up := nomad.waitScaled(t, 5*time.Second, 3)
	if up.err != nil {
		t.Fatalf("last call %+v", up)
	}
	calls := nomad.snapshot()
	if len(calls) != 2 || !errors.Is(calls[0].err, ErrBusy) {
		t.Errorf("calls %+v: want one refused while busy, then the scale", calls)
	}
	if d := time.Since(start); d < busyRetry-200*time.Millisecond {
		t.Errorf("scaled %s after a busy refusal; the wait is %s", d, busyRetry)
	}
}
