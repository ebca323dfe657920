package servicedeploy

import (
	"context"
	"strings"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/servestore"
	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/servekv"
)

func TestRouteConflict(t *testing.T) {
	routes := []servekv.Route{
		{Namespace: "default", Service: "bert", PathPrefix: "/bert"},
		{Namespace: "team-a", Service: "llm", PathPrefix: "/llm", Host: "api.example.com"},
	}
	svc := func(name, path, host string) *spec.Service {
		return &spec.Service{Name: name, Route: spec.Route{Path: path, Host: host}}
	}
	for _, tc := range []struct {
		name    string
		s       *spec.Service
		ns      string
		blocked string // a word of the refusal, "" when free
	}{
		{"a free path", svc("gpt", "/gpt", ""), "default", ""},
		{"its own route (a redeploy)", svc("bert", "/bert", ""), "default", ""},
		{"the same path, another service", svc("other", "/bert", ""), "default", "default/bert"},
		{"the same path, another namespace", svc("bert", "/bert", ""), "team-b", "default/bert"},
		{"a path under another's", svc("sub", "/bert/v2", ""), "default", "default/bert"},
		{"a path around another's", svc("root", "/", ""), "default", "default/bert"},
		{"a prefix that is not a segment", svc("berta", "/berta", ""), "default", ""},
		{"the same path on another host", svc("llm2", "/llm", "other.example.com"), "team-a", ""},
		{"the same path on the same host, any case", svc("llm2", "/llm/x", "API.example.com"), "team-a", "api.example.com/llm"},
	} {
		err := RouteConflict(routes, tc.s, tc.ns)
		switch {
		case tc.blocked == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case tc.blocked != "" && (err == nil || !strings.Contains(err.Error(), tc.blocked)):
			t.Errorf("%s: %v, want a refusal naming %s", tc.name, err, tc.blocked)
		}
	}
}

func TestKeepCount(t *testing.T) {
	job := func(n int) *api.Job {
		name := render.ServiceGroup
		return &api.Job{TaskGroups: []*api.TaskGroup{{Name: &name, Count: &n}}}
	}
	for _, tc := range []struct{ spec, running, lo, hi, want int }{
		{2, 5, 1, 8, 5}, // the autoscaler's count is kept
		{2, 5, 1, 4, 4}, // within the new bounds
		{2, 1, 3, 8, 3},
	} {
		j := job(tc.spec)
		KeepCount(j, job(tc.running), tc.lo, tc.hi)
		if got := *Group(j).Count; got != tc.want {
			t.Errorf("spec %d, running %d, bounds %d..%d: count %d, want %d", tc.spec, tc.running, tc.lo, tc.hi, got, tc.want)
		}
	}
	j := job(2)
	KeepCount(j, &api.Job{}, 1, 8) // nothing running to keep
	if *Group(j).Count != 2 {
		t.Errorf("no running group: count %d, want the spec's 2", *Group(j).Count)
	}
}

func TestConclude(t *testing.T) {
	ctx := context.Background()
	fake := nomadapi.NewFake()
	ver := "v2"
	fake.SetJob(&api.Job{ID: &[]string{"bert"}[0], Meta: map[string]string{contract.MetaKind: contract.KindService, contract.MetaVersion: ver}})
	var store servestore.Store // not reached: nothing is reverted

	res := Result{Service: "bert", Version: ver, Status: "registered"}
	if _, _, failed := Conclude(ctx, fake, store, &res, nil); failed != nil || res.Status != api.DeploymentStatusSuccessful {
		t.Errorf("no deployment (an unchanged job): %v, status %s; want success", failed, res.Status)
	}
	res = Result{Service: "bert", Version: ver}
	d := &api.Deployment{ID: "d1", Status: api.DeploymentStatusSuccessful}
	if _, _, failed := Conclude(ctx, fake, store, &res, d); failed != nil || res.Deployment != "d1" {
		t.Errorf("a successful deployment: %v, %+v", failed, res)
	}
	res = Result{Service: "bert", Version: ver}
	d = &api.Deployment{ID: "d2", Status: api.DeploymentStatusFailed, StatusDescription: "Failed due to progress deadline"}
	reverted, restoreErr, failed := Conclude(ctx, fake, store, &res, d)
	if failed == nil || !strings.Contains(failed.Error(), "progress deadline") || res.Status != api.DeploymentStatusFailed {
		t.Errorf("a failed deployment: %v, %+v", failed, res)
	}
	if reverted != "" || restoreErr != nil {
		t.Errorf("the job still runs the deployed version: reverted to %q (%v), want nothing reverted", reverted, restoreErr)
	}
}
