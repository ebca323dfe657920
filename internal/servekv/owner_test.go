package servekv

import (
	"encoding/json"
	"strings"
	"testing"
)

func claim(r Route) map[string]string {
	b, _ := json.Marshal(r)
	return map[string]string{JobMetaKind: JobKindService, JobMetaRoute: string(b)}
}

func TestJobRouteBelievesOnlyAJobThatClaimsTheRoute(t *testing.T) {
	own := claim(Route{Namespace: "team", Service: "bert", JobID: "bert", Group: "serve"})
	if r, err := JobRoute("team", "bert", "team", "bert", own); err != nil || r.Group != "serve" {
		t.Fatalf("the service's own job: %v, %v", r, err)
	}
	if _, err := JobRoute("default", "bert", "", "bert", claim(Route{Namespace: "default", Service: "bert", JobID: "bert"})); err != nil {
		t.Errorf("a job of the default namespace (\"\"): %v", err)
	}
	for _, c := range []struct {
		name       string
		jobNS, job string
		meta       map[string]string
		want       string
	}{
		{"another namespace's job", "other", "bert", own, "is in namespace other, not the route's team"},
		{"a plain job", "team", "bert", map[string]string{"owner": "x"}, "is not a gpujob service"},
		{"a service without a route", "team", "bert", map[string]string{JobMetaKind: JobKindService}, "claims no route"},
		{"a broken claim", "team", "bert", map[string]string{JobMetaKind: JobKindService, JobMetaRoute: "{"}, "gpujob_route meta"},
		{"another service's job", "team", "victim", claim(Route{Namespace: "team", Service: "victim", JobID: "victim"}),
			"claims the route of team/victim (job victim), not of team/bert"},
		{"a claim naming another job", "team", "impostor", claim(Route{Namespace: "team", Service: "bert", JobID: "bert"}),
			"claims the route of team/bert (job bert)"},
		{"a claim of another namespace's route", "team", "bert", claim(Route{Namespace: "other", Service: "bert", JobID: "bert"}),
			"claims the route of other/bert"},
	} {
		_, err := JobRoute("team", "bert", c.jobNS, c.job, c.meta)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
}

func TestParseAndFormatSize(t *testing.T) {
	for in, want := range map[string]int64{
		"10MiB": 10 << 20, "10 MiB": 10 << 20, "512KiB": 512 << 10, "1GiB": 1 << 30, "1.5KiB": 1536,
		"65536": 65536, "100B": 100, "10M": 10 << 20, "64K": 64 << 10, "1MB": 1000000, "0": 0,
	} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "ten", "-1KiB", "0.5B", "1e30GiB", "NaN"} {
		if _, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) did not fail", in)
		}
	}
	for n, want := range map[int64]string{10 << 20: "10MiB", 1536 << 10: "1536KiB", 100: "100B", 0: "0B", 1 << 30: "1GiB"} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
		if back, err := ParseSize(FormatSize(n)); err != nil || back != n {
			t.Errorf("ParseSize(FormatSize(%d)) = %d, %v", n, back, err)
		}
	}
}
