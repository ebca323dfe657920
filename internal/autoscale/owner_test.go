package autoscale

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpujob/gpujob/internal/servekv"
)

// Attack: routes written straight into Consul KV (what any user of the
// namespace's services token may do) that point the autoscaler at a job
// that is not theirs: a plain job of the namespace, another service's job,
// and the route's own job under a group it does not claim. Idle, each would
// take its job to min 0. None is ever scaled, each refusal is logged once,
// and the job is read again only now and then. The service beside them
// that owns its route scales as before.
func TestAutoscalerScalesOnlyTheJobThatClaimsTheRoute(t *testing.T) {
	c := newClient(t)
	prefix, gw := testPrefixes(t)
	down := servekv.Autoscale{Min: 0, Max: 2, TargetInflight: 1}
	hostile := func(svc, job, group string) {
		putJSON(t, c, servekv.RouteKey(prefix, "team", svc), servekv.Route{
			Namespace: "team", Service: svc, ConsulService: svc, Tag: "gpujob-ns=team",
			PathPrefix: "/" + svc, JobID: job, Group: group, Autoscale: &down,
		})
	}
	hostile("hijack", "bystander", "serve")
	hostile("steal", "victim", "serve")
	hostile("sidegroup", "sidegroup", "other")
	putJSON(t, c, servekv.RouteKey(prefix, "team", "own"), servekv.Route{
		Namespace: "team", Service: "own", ConsulService: "own", Tag: "gpujob-ns=team",
		PathPrefix: "/own", JobID: "own", Group: "serve", Autoscale: &down,
	})
	nomad := &fakeNomad{}
	nomad.set("team", "bystander", "serve", 1)
	nomad.setMeta("team", "bystander", map[string]string{"owner": "someone else"})
	nomad.set("team", "victim", "serve", 1) // claims the service "victim"
	nomad.set("team", "sidegroup", "other", 1)
	nomad.setMeta("team", "sidegroup", claimMeta("team", "sidegroup", "sidegroup", "serve"))
	nomad.set("team", "own", "serve", 1)
	putJSON(t, c, servekv.LoadKey(gw, "gw-x"), servekv.Load{Gateway: "gw-x", Inflight: map[string]int{}, Updated: time.Now()})

	var mu sync.Mutex
	var logs []string
	a, err := New(Config{Consul: c, Prefix: prefix, GatewayPrefix: gw, ID: "gw-a", Scaler: nomad.scaler("gw-a"),
		Tick: 100 * time.Millisecond, Logf: func(format string, args ...any) {
			mu.Lock()
			defer mu.Unlock()
			logs = append(logs, fmt.Sprintf(format, args...))
		}})
	if err != nil {
		t.Fatal(err)
	}
	stop := runBg(t, 5*time.Second, a.Run)
	// The service that owns its route goes to 0: the autoscaler works.
	nomad.waitScaled(t, 5*time.Second, 0)
	time.Sleep(2 * time.Second) // 20 ticks
	stop()
	for _, call := range nomad.snapshot() {
		if call.job != "own" {
			t.Errorf("scaled a job on a route that is not its service's: %+v", call)
		}
	}
	all := strings.Join(logs, "\n")
	for _, want := range []string{
		"route team/hijack names job bystander group serve: job team/bystander is not a gpujob service",
		"route team/steal names job victim group serve: job team/victim claims the route of team/victim",
		`route team/sidegroup names job sidegroup group other: the job claims its group "serve", not "other"`,
	} {
		if n := strings.Count(all, want); n != 1 {
			t.Errorf("logged %d times, want once: %q\n%s", n, want, all)
		}
	}
	if !strings.Contains(all, "not autoscaling it") {
		t.Errorf("no refusal says the route is not autoscaled:\n%s", all)
	}
	// 20 ticks: the refused jobs were read once each, not once a tick.
	nomad.mu.Lock()
	defer nomad.mu.Unlock()
	for _, job := range []string{"bystander", "victim", "sidegroup"} {
		if n := nomad.reads["team/"+job]; n != 1 {
			t.Errorf("job %s read %d times in 20 ticks, want once (again after %s)", job, n, refusedRecheck)
		}
	}
}
