package service

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/iostreams"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/servestore"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/servekv"
	"github.com/gpujob/gpujob/internal/testagent"
)

var epoch = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

var shared testagent.Lazy

func TestMain(m *testing.M) { os.Exit(shared.Main(m)) }

func consulClient(t *testing.T) *consul.Client {
	t.Helper()
	return shared.Client(t)
}

var (
	jobLabel   = regexp.MustCompile(`(?m)^job "([^"]+)"`)
	countRe    = regexp.MustCompile(`(?m)^\s+count = (\d+)`)
	minRe      = regexp.MustCompile(`(?m)^\s+min\s+= (\d+)`)
	maxRe      = regexp.MustCompile(`(?m)^\s+max\s+= (\d+)`)
	versionRe  = regexp.MustCompile(`gpujob_version = "([^"]+)"`)
	jobKindRe  = regexp.MustCompile(`(?m)^\s+gpujob\s+= "([^"]+)"`)
	numberOnce = func(re *regexp.Regexp, src string) int64 {
		n, _ := strconv.ParseInt(re.FindStringSubmatch(src)[1], 10, 64)
		return n
	}
)

// newFake is a fake Nomad whose parser reads what the commands read back
// from a rendered service job: its ID, meta, count and scaling bounds.
func newFake() *nomadapi.Fake {
	f := nomadapi.NewFake()
	f.ParseHCLFunc = func(src, _ string) (*api.Job, error) {
		id := jobLabel.FindStringSubmatch(src)[1]
		count := int(numberOnce(countRe, src))
		lo, hi := numberOnce(minRe, src), numberOnce(maxRe, src)
		name := render.ServiceGroup
		return &api.Job{ID: &id, Name: &id,
			Meta: map[string]string{contract.MetaKind: jobKindRe.FindStringSubmatch(src)[1], contract.MetaVersion: versionRe.FindStringSubmatch(src)[1]},
			TaskGroups: []*api.TaskGroup{{Name: &name, Count: &count,
				Scaling: &api.ScalingPolicy{Min: &lo, Max: &hi}}}}, nil
	}
	return f
}

func execute(t *testing.T, c *consul.Client, f *nomadapi.Fake, args ...string) (string, error) {
	t.Helper()
	ios, _, out, _ := iostreams.Test()
	fac := &factory.Factory{IO: ios, Now: func() time.Time { return epoch },
		Nomad:     func() (nomadapi.API, error) { return f, nil },
		Consul:    func() (*consul.Client, error) { return c, nil },
		Namespace: func() string { return "default" }}
	cmd := NewCmd(fac)
	cmd.SetArgs(args)
	cmd.SetOut(out)
	cmd.SetErr(out)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := cmd.ExecuteContext(ctx)
	return out.String(), err
}

const serviceSrc = `service "%s" {
  gpus_per_replica = 0
  command = "/usr/bin/python3"
  args    = ["/w/serve.py"]
  version = "%s"
  replicas {
    min     = 1
    max     = 4
    initial = 2
  }
  autoscale {
    target_inflight = 2
  }
  route {
    rate_limit {
      rps = 10
      burst = 20
    }
  }
}
`

func writeSpec(t *testing.T, name, version string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "svc.hcl")
	src := strings.Replace(strings.Replace(serviceSrc, "%s", name, 1), "%s", version, 1)
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDeployWritesTheRouteAndRegisters(t *testing.T) {
	c := consulClient(t)
	f := newFake()
	out, err := execute(t, c, f, "deploy", "--detach", "--gateway", "http://gw:9", writeSpec(t, "dep", "v1"))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(f.Registered) != 1 || *f.Registered[0].ID != "dep" {
		t.Fatalf("registered %v", f.Registered)
	}
	if !strings.Contains(out, "deployed dep v1 (job version 0): 2 replica(s)") || !strings.Contains(out, "gpujob service status dep") {
		t.Errorf("output:\n%s", out)
	}
	r, err := servestore.Open(&factory.Factory{Consul: func() (*consul.Client, error) { return c, nil }})
	if err != nil {
		t.Fatal(err)
	}
	route, err := r.Route(context.Background(), "default", "dep")
	if err != nil || route == nil {
		t.Fatalf("route %v %v", route, err)
	}
	if route.PathPrefix != "/dep" || !route.Auth || route.RateLimit.RPS != 10 || route.RateLimit.Burst != 20 ||
		route.Tag != "gpujob-ns=default" || route.ConsulService != "dep" || route.Group != render.ServiceGroup ||
		route.Autoscale == nil || route.Autoscale.Max != 4 || route.Autoscale.TargetInflight != 2 {
		t.Errorf("route %+v", route)
	}

	// A redeploy keeps the count a scale set.
	if _, err := f.ScaleGroup("dep", render.ServiceGroup, 3, "test"); err != nil {
		t.Fatal(err)
	}
	out, err = execute(t, c, f, "deploy", "--detach", writeSpec(t, "dep", "v2"))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	job, _ := f.Job("dep")
	if got := *job.TaskGroups[0].Count; got != 3 || job.Meta[contract.MetaVersion] != "v2" {
		t.Errorf("after the update: count %d version %s; want 3 and v2\n%s", got, job.Meta[contract.MetaVersion], out)
	}
	if !strings.Contains(out, "updating dep v2") {
		t.Errorf("output:\n%s", out)
	}
}

func TestDeployRefusesAJobThatIsNoService(t *testing.T) {
	c := consulClient(t)
	f := newFake()
	id, kind := "other", "train"
	f.SetJob(&api.Job{ID: &id, Name: &id, Meta: map[string]string{contract.MetaKind: kind}})
	out, err := execute(t, c, f, "deploy", "--detach", writeSpec(t, "other", "v1"))
	if err == nil || !strings.Contains(err.Error(), "is not a gpujob service") {
		t.Fatalf("err %v\n%s", err, out)
	}
	if len(f.Registered) != 0 {
		t.Errorf("registered %d jobs", len(f.Registered))
	}
	if r, _ := (servestore.Open(&factory.Factory{Consul: func() (*consul.Client, error) { return c, nil }})); r.Consul != nil {
		if route, _ := r.Route(context.Background(), "default", "other"); route != nil {
			t.Errorf("a route was written for a refused deploy: %+v", route)
		}
	}
}

func TestDeployWaitsForTheDeployment(t *testing.T) {
	c := consulClient(t)
	f := newFake()
	f.OnBlock = nil
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The deployment Nomad would create, failing.
		for i := 0; i < 100; i++ {
			if j, err := f.Job("wait"); err == nil && j != nil {
				f.SetDeployment("wait", &api.Deployment{ID: "d1234567-0000", JobVersion: *j.Version, Status: api.DeploymentStatusFailed,
					StatusDescription: "Failed due to unhealthy allocations - rolling back to job version 0",
					TaskGroups:        map[string]*api.DeploymentState{render.ServiceGroup: {DesiredTotal: 2, UnhealthyAllocs: 1}}})
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	out, err := execute(t, c, f, "deploy", writeSpec(t, "wait", "v3"))
	<-done
	if err == nil || !strings.Contains(err.Error(), "failed: Failed due to unhealthy allocations - rolling back") {
		t.Fatalf("err %v\n%s", err, out)
	}
	if !strings.Contains(out, "deployment d1234567 (job version 0): failed; 0/2 healthy, 1 unhealthy") {
		t.Errorf("output:\n%s", out)
	}
}

func TestScaleStaysWithinTheBounds(t *testing.T) {
	c := consulClient(t)
	f := newFake()
	if out, err := execute(t, c, f, "deploy", "--detach", writeSpec(t, "sc", "v1")); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if out, err := execute(t, c, f, "scale", "sc", "5"); err == nil || !strings.Contains(err.Error(), "runs 1 to 4 replicas") {
		t.Errorf("scale above max: %v\n%s", err, out)
	}
	out, err := execute(t, c, f, "scale", "sc", "3")
	if err != nil || !strings.Contains(out, "scaled sc from 2 to 3 replica(s)") {
		t.Fatalf("%v\n%s", err, out)
	}
	if j, _ := f.Job("sc"); *j.TaskGroups[0].Count != 3 {
		t.Errorf("count %d", *j.TaskGroups[0].Count)
	}
}

func TestStopKeepsTokensUnlessPurged(t *testing.T) {
	c := consulClient(t)
	f := newFake()
	if out, err := execute(t, c, f, "deploy", "--detach", writeSpec(t, "st", "v1")); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	store, _ := servestore.Open(&factory.Factory{Consul: func() (*consul.Client, error) { return c, nil }})
	ctx := context.Background()
	if _, _, err := store.CreateToken(ctx, "default", "st", "ci", nil, epoch); err != nil {
		t.Fatal(err)
	}
	if out, err := execute(t, c, f, "stop", "st"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if r, _ := store.Route(ctx, "default", "st"); r != nil {
		t.Error("the route survived stop")
	}
	if toks, _ := store.Tokens(ctx, "default", "st"); len(toks) != 1 {
		t.Errorf("stop without --purge left %d tokens, want 1", len(toks))
	}
	if len(f.Deregistered) != 1 {
		t.Errorf("deregistered %v", f.Deregistered)
	}
	f2 := newFake()
	if out, err := execute(t, c, f2, "deploy", "--detach", writeSpec(t, "st", "v1")); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if out, err := execute(t, c, f2, "stop", "--purge", "st"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	pairs, _, _ := c.KV().List(servekv.ServiceKey(servestore.KeyPrefix(), "default", "st")+"/", nil)
	if len(pairs) != 0 {
		t.Errorf("purge left %d keys", len(pairs))
	}
}

// A service never takes over another's path, whatever its namespace, and
// the spec's namespace must be the CLI's.
func TestDeployRefusesATakenRouteAndAnotherNamespace(t *testing.T) {
	c := consulClient(t)
	f := newFake()
	if out, err := execute(t, c, f, "deploy", "--detach", writeSpec(t, "owner", "v1")); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	src := strings.Replace(strings.Replace(serviceSrc, "%s", "thief", 1), "%s", "v1", 1)
	for _, c2 := range []struct{ route, want string }{
		{"route {\n    path = \"/owner\"\n", "would take over /owner, which service default/owner has"},
		{"route {\n    path = \"/owner/predict\"\n", "would take over /owner"},
	} {
		p := filepath.Join(t.TempDir(), "thief.hcl")
		if err := os.WriteFile(p, []byte(strings.Replace(src, "route {\n", c2.route, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := execute(t, c, f, "deploy", "--detach", p)
		if err == nil || !strings.Contains(err.Error(), c2.want) {
			t.Errorf("%q: err %v\n%s", c2.route, err, out)
		}
	}
	p := filepath.Join(t.TempDir(), "ns.hcl")
	if err := os.WriteFile(p, []byte(strings.Replace(src, "gpus_per_replica = 0", "gpus_per_replica = 0\n  namespace = \"prod\"", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := execute(t, c, f, "deploy", "--detach", p); err == nil || !strings.Contains(err.Error(), "set --namespace prod") {
		t.Errorf("namespace mismatch: %v\n%s", err, out)
	}
	if len(f.Registered) != 1 {
		t.Errorf("registered %d jobs, want only the owner", len(f.Registered))
	}
}

// A rollback brings back the route of the version it goes back to.
func TestRollbackRestoresTheRoute(t *testing.T) {
	c := consulClient(t)
	f := newFake()
	if out, err := execute(t, c, f, "deploy", "--detach", writeSpec(t, "rb", "v1")); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// v2 drops the rate limit.
	src := strings.Replace(strings.Replace(serviceSrc, "%s", "rb", 1), "%s", "v2", 1)
	src = strings.Replace(src, "    rate_limit {\n      rps = 10\n      burst = 20\n    }\n", "", 1)
	p := filepath.Join(t.TempDir(), "rb.hcl")
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := execute(t, c, f, "deploy", "--detach", p); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	store, _ := servestore.Open(&factory.Factory{Consul: func() (*consul.Client, error) { return c, nil }})
	if r, _ := store.Route(context.Background(), "default", "rb"); r == nil || r.RateLimit != nil {
		t.Fatalf("v2's route: %+v", r)
	}
	// Nomad marks deployed versions stable; the fake does not.
	versions, _ := f.JobVersions("rb")
	for _, v := range versions {
		stable := true
		v.Stable = &stable
		if *v.Version == 0 {
			f.SetJob(v) // the history is what Revert reads; Stable is for rollbackTarget
		}
	}
	out, err := execute(t, c, f, "rollback", "--detach", "--to-version", "0", "rb")
	if err != nil || !strings.Contains(out, "rolling rb back to v1 (job version 0)") {
		t.Fatalf("%v\n%s", err, out)
	}
	if r, _ := store.Route(context.Background(), "default", "rb"); r == nil || r.RateLimit == nil || r.RateLimit.RPS != 10 {
		t.Errorf("after the rollback the route is %+v, want v1's with its rate limit", r)
	}
}

// stop removes a route whose job is gone (a deploy that failed half-way).
func TestStopRemovesAnOrphanRoute(t *testing.T) {
	c := consulClient(t)
	f := newFake()
	store, _ := servestore.Open(&factory.Factory{Consul: func() (*consul.Client, error) { return c, nil }})
	if err := store.PutRoute(context.Background(), servekv.Route{Namespace: "default", Service: "orphan", PathPrefix: "/orphan", ConsulService: "orphan"}); err != nil {
		t.Fatal(err)
	}
	out, err := execute(t, c, f, "stop", "orphan")
	if err != nil || !strings.Contains(out, "no job in Nomad; removed its route") {
		t.Fatalf("%v\n%s", err, out)
	}
	if r, _ := store.Route(context.Background(), "default", "orphan"); r != nil {
		t.Error("the orphan route survived")
	}
	if _, err := execute(t, c, f, "stop", "orphan"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("stopping nothing: %v", err)
	}
}
