package service

import (
	"testing"

	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/servekv"
)

// The gateways and the autoscaler believe a route's job only when its meta
// claims the route (servekv.JobRoute): the job deploy registers must.
func TestADeployedJobClaimsItsRoute(t *testing.T) {
	if servekv.JobMetaKind != contract.MetaKind || servekv.JobKindService != contract.KindService || servekv.JobMetaRoute != MetaRoute {
		t.Fatalf("servekv's job meta names (%s=%s, %s) are not the ones deploy writes (%s=%s, %s)",
			servekv.JobMetaKind, servekv.JobKindService, servekv.JobMetaRoute, contract.MetaKind, contract.KindService, MetaRoute)
	}
	c := consulClient(t)
	f := newFake()
	if out, err := execute(t, c, f, "deploy", "--detach", writeSpec(t, "claim", "v1")); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	job, err := f.Job("claim")
	if err != nil {
		t.Fatal(err)
	}
	ns := ""
	if job.Namespace != nil {
		ns = *job.Namespace
	}
	r, err := servekv.JobRoute("default", "claim", ns, "claim", job.Meta)
	if err != nil {
		t.Fatalf("the deployed job does not claim its route: %v", err)
	}
	if r.Group != render.ServiceGroup {
		t.Errorf("the job claims group %q, want %q", r.Group, render.ServiceGroup)
	}
}

func TestRouteOfCarriesTheBodyLimit(t *testing.T) {
	s := &spec.Service{Name: "b", Route: spec.Route{Path: "/b", MaxBodyBytes: 2 << 20}}
	if r := RouteOf(s, "default"); r.MaxBodyBytes != 2<<20 {
		t.Errorf("route max_body_bytes %d, want 2 MiB", r.MaxBodyBytes)
	}
}
