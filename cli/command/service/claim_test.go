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

func TestGatewayAdminAddr(t *testing.T) {
	t.Setenv(EnvGatewayAdmin, "")
	for _, c := range []struct{ flag, gw, want string }{
		{"", "http://127.0.0.1:8080", "http://127.0.0.1:8081"},
		{"", "http://gw.example.com:18080/", "http://gw.example.com:18081"},
		{"http://127.0.0.1:9000/", "http://127.0.0.1:8080", "http://127.0.0.1:9000"},
		{"", "http://gw.example.com", "http://gw.example.com"},
	} {
		if got := GatewayAdminAddr(c.flag, c.gw); got != c.want {
			t.Errorf("GatewayAdminAddr(%q, %q) = %q, want %q", c.flag, c.gw, got, c.want)
		}
	}
	t.Setenv(EnvGatewayAdmin, "http://10.0.0.5:8081")
	if got := GatewayAdminAddr("", "http://127.0.0.1:8080"); got != "http://10.0.0.5:8081" {
		t.Errorf("with $%s: %q", EnvGatewayAdmin, got)
	}
}
