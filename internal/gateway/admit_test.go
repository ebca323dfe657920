package gateway

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpujob/gpujob/internal/servekv"
)

func TestAllocOfServiceID(t *testing.T) {
	const alloc = "0f3c2a9e-5b1d-4c2e-9a7f-1234567890ab"
	for _, c := range []struct {
		id, want string
		ok       bool
	}{
		{"_nomad-task-" + alloc + "-serve-bert-http", alloc, true},
		{"_nomad-task-" + alloc + "-group-serve-bert-http", alloc, true},
		{"_nomad-task-" + alloc, "", false}, // nothing after the ID
		{"_nomad-task-" + strings.ToUpper(alloc) + "-x", "", false},
		{"_nomad-task-0f3c2a9e-5b1d-4c2e-9a7f-1234567890a-x-y", "", false}, // too short
		{"rep-1", "", false},
		{"evil-_nomad-task-" + alloc + "-x", "", false},
	} {
		got, ok := allocOfServiceID(c.id)
		if got != c.want || ok != c.ok {
			t.Errorf("allocOfServiceID(%q) = %q, %v; want %q, %v", c.id, got, ok, c.want, c.ok)
		}
	}
}

// impostor is a server that answers as "impostor", and its host:port.
func impostor(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(echo("impostor"))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// Attack: instances under the route's Consul name and namespace tag that
// are not replicas of the route's job get no request. One is a plain
// Consul registration, one a running allocation of another job of the
// namespace (Nomad registers it exactly like a replica), one forges the
// service ID of the real replica's allocation at its own address.
func TestAdmitsOnlyTheReplicasNomadVouchesFor(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	realID, _ := h.backend("m", "v1", echo("real"))
	h.route("m", servekv.Route{})

	h.register(h.consulService("m"), "evil-"+h.id, impostor(t), "v1")
	otherAddr := impostor(t)
	otherAlloc := h.nomad.runAlloc(h.ns, "job-"+h.id+"-other", "serve", otherAddr)
	h.nomad.serviceJob(h.ns, "other", "job-"+h.id+"-other")
	h.register(h.consulService("m"), fmt.Sprintf("_nomad-task-%s-serve-%s-http", otherAlloc, h.consulService("m")), otherAddr, "v1")
	realAlloc, _ := allocOfServiceID(realID)
	h.register(h.consulService("m"), fmt.Sprintf("_nomad-task-%s-serve-%s-forged", realAlloc, h.consulService("m")), impostor(t), "v1")

	h.waitRoute("m", "", "/m")
	h.eventually(5*time.Second, "three refused instances", func() bool {
		s := h.service("m")
		return s != nil && fmt.Sprint(s.pool.Load().refusals()) == fmt.Sprint(map[string]int{
			refusedNotNomad: 1, refusedAllocation: 1, refusedAddress: 1})
	})
	if eps := h.waitEndpoints("m", 1); eps[0].id != realID {
		t.Fatalf("the pool holds %s, want the real replica %s", eps[0].id, realID)
	}
	for i := range 50 {
		if res := h.get("/m/x"); res.code != 200 || res.body != "real /x" {
			t.Fatalf("request %d: %d %q (an impostor answered?)", i, res.code, res.body)
		}
	}
	for _, want := range []string{
		"refusing consul instance evil-" + h.id,
		"refusing consul instance _nomad-task-" + otherAlloc,
		"refusing consul instance _nomad-task-" + realAlloc + "-serve-" + h.consulService("m") + "-forged",
	} {
		if !strings.Contains(h.logged(), want) {
			t.Errorf("not logged: %q\n%s", want, h.logged())
		}
	}
	// One series per reason, the one that admits nothing at 0.
	res := h.doAt(h.admin, http.MethodGet, MetricsPath, nil)
	for reason, n := range map[string]int{refusedRoute: 0, refusedNotNomad: 1, refusedAllocation: 1, refusedAddress: 1} {
		want := fmt.Sprintf(`gpujob_gateway_refused_instances{namespace="team-a",reason="%s",service="m"} %d`, reason, n)
		if !strings.Contains(res.body, want+"\n") {
			t.Errorf("no %s in the metrics", want)
		}
	}
}

// Each refused instance is counted under the one reason that fits it, so
// the metric tells a forged replica ID (address) from a registration
// outside Nomad or another job's allocation.
func TestRefusalReasons(t *testing.T) {
	const (
		alloc = "0f3c2a9e-5b1d-4c2e-9a7f-1234567890ab"
		other = "1f3c2a9e-5b1d-4c2e-9a7f-1234567890ab"
		id    = "_nomad-task-" + alloc + "-serve-m-http"
	)
	route := replicaSet{loaded: true, addrs: map[string]map[string]bool{alloc: {"10.0.0.1:8000": true}}}
	for _, c := range []struct {
		name     string
		set      replicaSet
		id, addr string
		reason   string // "" when admitted
	}{
		{"the replica", route, id, "10.0.0.1:8000", ""},
		{"the replica, its IP spelled otherwise", route, id, "[::ffff:10.0.0.1]:8000", ""},
		{"a plain Consul registration", route, "m-1", "10.0.0.1:8000", refusedNotNomad},
		{"another allocation", route, "_nomad-task-" + other + "-serve-m-http", "10.0.0.2:8000", refusedAllocation},
		{"the replica's ID at another port", route, id, "10.0.0.1:8001", refusedAddress},
		{"the replica's ID at another host", route, id, "10.0.0.9:8000", refusedAddress},
		{"a route that admits nothing", replicaSet{loaded: true, refusal: "Nomad has no job j in namespace n"}, id, "10.0.0.1:8000", refusedRoute},
	} {
		ok, reason, why := c.set.admits(c.id, c.addr)
		if ok != (c.reason == "") || reason != c.reason {
			t.Errorf("%s: admits = %v, %q (%s); want reason %q", c.name, ok, reason, why, c.reason)
		}
		if !ok && why == "" {
			t.Errorf("%s: refused without an explanation for the log", c.name)
		}
		if !ok && !slices.Contains(refusalReasons, reason) {
			t.Errorf("%s: reason %q is not one the metrics list", c.name, reason)
		}
	}
}

// Attack: a route (a KV value any user of the namespace may write) naming
// a job that does not claim it, in its Nomad meta, as that service's,
// gets no replica of that job; once the job claims it, it does.
func TestARouteServesOnlyAJobThatClaimsIt(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	victimJob := "job-" + h.id + "-victim"
	h.nomad.serviceJob(h.ns, "victim", victimJob) // another service's job
	srv := httptest.NewServer(echo("victim"))
	t.Cleanup(srv.Close)
	addr := strings.TrimPrefix(srv.URL, "http://")
	alloc := h.nomad.runAlloc(h.ns, victimJob, "serve", addr)
	h.register(h.consulService("m"), fmt.Sprintf("_nomad-task-%s-serve-%s-http", alloc, h.consulService("m")), addr, "v1")
	h.route("m", servekv.Route{JobID: victimJob, Group: "serve", QueueLimit: -1})
	h.waitRoute("m", "", "/m")
	h.eventually(5*time.Second, "the pool loaded", func() bool { return h.service("m").pool.Load().snapshot().loaded })
	if res := h.get("/m"); res.code != http.StatusServiceUnavailable {
		t.Errorf("a route to a job that is another service's: %d %s, want 503", res.code, res.body)
	}
	if !strings.Contains(h.logged(), "admitting no replica: job team-a/"+victimJob+" claims the route of team-a/victim") {
		t.Errorf("the refusal was not logged:\n%s", h.logged())
	}
	h.eventually(5*time.Second, "the instance counted as refused by the route", func() bool {
		return h.service("m").pool.Load().refusals()[refusedRoute] == 1
	})

	// A plain job that claims nothing, and no job at all: the same.
	h.nomad.putJob(h.ns, victimJob, map[string]string{"owner": "someone"})
	h.eventually(5*time.Second, "the refusal of a plain job", func() bool {
		return strings.Contains(h.logged(), "is not a gpujob service")
	})
	if len(h.endpoints("m")) != 0 {
		t.Error("a plain job's allocation was admitted")
	}

	// The job claims the route (deployed as this service): admitted.
	h.nomad.serviceJob(h.ns, "m", victimJob)
	h.waitEndpoints("m", 1)
	if res := h.get("/m"); res.code != 200 || res.body != "victim /" {
		t.Errorf("once the job claims the route: %d %q", res.code, res.body)
	}
}

// An allocation that stops running leaves the pool even while Consul still
// lists it as healthy; a Nomad outage keeps the replicas it last vouched
// for.
func TestFollowsNomadAndRidesOutItsOutage(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id1, _ := h.backend("m", "v1", echo("one"))
	h.backend("m", "v1", echo("two"))
	h.route("m", servekv.Route{})
	h.waitRoute("m", "", "/m")
	h.waitEndpoints("m", 2)

	h.nomad.setErr(errors.New("nomad is down"))
	time.Sleep(300 * time.Millisecond)
	if n := len(h.endpoints("m")); n != 2 {
		t.Fatalf("a Nomad outage left %d endpoints, want the 2 it knew", n)
	}
	if !strings.Contains(h.logged(), "nomad is down (keeping the last good ones)") {
		t.Errorf("the Nomad error was not logged:\n%s", h.logged())
	}
	h.nomad.setErr(nil)
	alloc1, _ := allocOfServiceID(id1)
	h.nomad.setAllocStatus(alloc1, "complete")
	eps := h.waitEndpoints("m", 1)
	if eps[0].id == id1 {
		t.Error("the stopped allocation stayed in the pool")
	}
	// Blocking queries, not a poll: a handful of calls for these changes.
	if n := h.nomad.listCalls.Load(); n > 40 {
		t.Errorf("%d allocation lists for a few changes: the gateway polls Nomad", n)
	}
}
