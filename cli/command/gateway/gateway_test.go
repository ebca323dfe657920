package gateway

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/internal/servekv"
)

func TestAdminAddressDefaultsToLoopbackOnTheNextPort(t *testing.T) {
	for _, c := range []struct{ listen, admin, want string }{
		{"127.0.0.1:8080", "", "127.0.0.1:8081"},
		{"10.0.0.5:18080", "", "127.0.0.1:18081"},
		{":8080", "", "127.0.0.1:8081"},
		{"127.0.0.1:0", "", "127.0.0.1:0"},
		{"127.0.0.1:8080", "10.0.0.5:9100", "10.0.0.5:9100"},
	} {
		got, err := adminAddress(c.listen, c.admin)
		if err != nil || got != c.want {
			t.Errorf("adminAddress(%q, %q) = %q, %v; want %q", c.listen, c.admin, got, err, c.want)
		}
	}
	if _, err := adminAddress("nonsense", ""); err == nil || !strings.Contains(err.Error(), "--listen") {
		t.Errorf("a bad --listen: %v", err)
	}
}

func TestAnAdminListenerBeyondLoopbackNeedsAToken(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:8081", "[::1]:8081", "localhost:8081", "127.0.0.2:8081"} {
		if err := checkAdminExposure(addr, ""); err != nil {
			t.Errorf("%s without a token: %v", addr, err)
		}
	}
	for _, addr := range []string{"0.0.0.0:8081", ":8081", "10.0.0.5:8081", "[::]:8081"} {
		err := checkAdminExposure(addr, "")
		if err == nil || !strings.Contains(err.Error(), "--admin-listen "+addr+" is not a loopback address") ||
			!strings.Contains(err.Error(), "--admin-token-file") {
			t.Errorf("%s without a token: %v, want a refusal naming the rule and the options", addr, err)
		}
		if err := checkAdminExposure(addr, "tok"); err != nil {
			t.Errorf("%s with a token: %v", addr, err)
		}
	}
}

func TestBadLimitsNameTheirFlag(t *testing.T) {
	if got := flagError(errors.New("gateway: MaxInflight is negative (-1)")); !strings.HasPrefix(got.Error(), "--max-inflight: ") {
		t.Errorf("flagError: %v", got)
	}
	if got := flagError(errors.New("gateway: MaxBufferedBytes 10 is under 524288, too little to buffer any body")); !strings.HasPrefix(got.Error(), "--max-buffered: ") {
		t.Errorf("flagError: %v", got)
	}
	var s sizeFlag
	if err := s.Set("10MiB"); err != nil || s != 10<<20 || s.String() != "10MiB" {
		t.Errorf("sizeFlag 10MiB: %d %v", s, err)
	}
	if err := s.Set("lots"); err == nil {
		t.Error("sizeFlag took \"lots\"")
	}
}

func TestTheAutoscalerReadsTheJobsClaim(t *testing.T) {
	fake := nomadapi.NewFake()
	id, ns, name := "bert", "team", "serve"
	count := 2
	meta := map[string]string{servekv.JobMetaKind: servekv.JobKindService, servekv.JobMetaRoute: `{"namespace":"team","service":"bert","job_id":"bert","group":"serve"}`}
	fake.SetJob(&api.Job{ID: &id, Name: &id, Namespace: &ns, Meta: meta, TaskGroups: []*api.TaskGroup{{Name: &name, Count: &count}}})
	clients := newNomadClients(func(string) (nomadapi.API, error) { return fake, nil })
	g, err := clients.Group(context.Background(), "team", "bert", "serve")
	if err != nil {
		t.Fatal(err)
	}
	if g.Count != 2 || g.JobNamespace != "team" || g.Meta[servekv.JobMetaRoute] != meta[servekv.JobMetaRoute] {
		t.Errorf("Group: %+v", g)
	}
	if _, err := clients.Group(context.Background(), "team", "bert", "other"); err == nil || !strings.Contains(err.Error(), `no group "other"`) {
		t.Errorf("a missing group: %v", err)
	}
	if j, err := clients.Job(context.Background(), "team", "nope"); err != nil || j != nil {
		t.Errorf("a missing job: %v, %v (want nil, nil)", j, err)
	}
}
