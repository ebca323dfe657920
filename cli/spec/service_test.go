package spec_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gpujob/gpujob/cli/spec"
)

const fullService = `service "bert-clf" {
  gpus_per_replica = 1
  command          = "/usr/bin/python3"
  args             = ["/opt/gpujob/workloads/serve.py", "--checkpoint", "/srv/ckpt/bert-finetune"]
  replicas {
    min     = 1
    max     = 4
    initial = 2
  }
  health {
    path          = "/healthz"
    interval      = "2s"
    timeout       = "1s"
    initial_delay = "10m"
  }
  update {
    canary       = 1
    max_parallel = 1
    auto_promote = true
    auto_revert  = true
  }
  autoscale {
    target_inflight  = 2
    scale_down_delay = "5m"
  }
  route {
    auth     = true
    max_body = "2MiB"
    rate_limit {
      rps   = 10
      burst = 20
    }
  }
  resources {
    cpu    = 1000
    memory = 2048
  }
}
`

func TestParseServiceFull(t *testing.T) {
	s, diags := spec.ParseService([]byte(fullService), "svc.hcl", spec.Options{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"name", s.Name, "bert-clf"},
		{"replicas", s.Replicas, spec.Replicas{Min: 1, Max: 4, Initial: 2}},
		{"initial delay", s.Health.InitialDelay, 10 * time.Minute},
		{"interval", s.Health.Interval, 2 * time.Second},
		{"canary", s.Update.Canary, 1},
		{"auto promote", s.Update.AutoPromote, true},
		{"target", s.Autoscale.TargetInflight, 2.0},
		{"down delay", s.Autoscale.ScaleDownDelay, 5 * time.Minute},
		{"route path default", s.Route.Path, "/bert-clf"},
		{"auth", s.Route.Auth, true},
		{"rate", *s.Route.RateLimit, spec.RateLimit{RPS: 10, Burst: 20}},
		{"max body", s.Route.MaxBodyBytes, int64(2 << 20)},
		{"memory", s.Resources.MemoryMiB, 2048},
		{"default version is a digest", strings.HasPrefix(s.Version, "v-") && len(s.Version) == 10, true},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
	// The digest follows what the replicas run.
	s2, _ := spec.ParseService([]byte(strings.Replace(fullService, "bert-finetune\"]", "bert-v2\"]", 1)), "svc.hcl", spec.Options{})
	if s2 == nil || s2.Version == s.Version {
		t.Errorf("changing args kept version %q", s.Version)
	}
}

func TestCanariesArePromotedUnlessSaidOtherwise(t *testing.T) {
	for _, c := range []struct {
		update string
		want   bool
	}{{"canary = 1", true}, {"canary = 1\n    auto_promote = false", false}, {"max_parallel = 1", false}} {
		src := "service \"s\" {\n  command = \"x\"\n  replicas {\n    min = 2\n  }\n  update {\n    " + c.update + "\n  }\n}\n"
		s, diags := spec.ParseService([]byte(src), "svc.hcl", spec.Options{})
		if diags.HasErrors() {
			t.Fatal(diags)
		}
		if s.Update.AutoPromote != c.want {
			t.Errorf("%q: auto_promote %v, want %v", c.update, s.Update.AutoPromote, c.want)
		}
	}
}

func TestParseServiceDefaults(t *testing.T) {
	s, diags := spec.ParseService([]byte("service \"echo\" {\n  command = \"/bin/true\"\n  version = \"v1\"\n}\n"), "svc.hcl", spec.Options{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	if s.Replicas != (spec.Replicas{Min: 1, Max: 1, Initial: 1}) || s.Autoscale != nil || !s.Route.Auth ||
		s.Route.RateLimit != nil || s.Version != "v1" || s.Health.Path != "/healthz" || s.GPUsPerReplica != 1 {
		t.Errorf("defaults: %+v", s)
	}
}

func TestParseServiceErrorsNameTheLine(t *testing.T) {
	body := func(extra string) string {
		return "service \"svc\" {\n  command = \"/bin/true\"\n" + extra + "}\n"
	}
	for _, c := range []struct {
		name, src string
		want      []string
	}{
		{"bad name", "service \"Bad_Name\" {\n  command = \"x\"\n}\n", []string{"svc.hcl:1:9: error: Invalid service name"}},
		{"no command", "service \"s\" {\n}\n", []string{"svc.hcl:1:1: error: Missing required argument"}},
		{"min above max", body("  replicas {\n    min = 3\n    max = 2\n  }\n  autoscale {\n    target_inflight = 1\n  }\n"), []string{"svc.hcl:4:11: error: Invalid replicas"}},
		{"range without autoscale", body("  replicas {\n    min = 1\n    max = 3\n  }\n"), []string{"svc.hcl:3:3: error: Replicas range without autoscale"}},
		{"autoscale without room", body("  autoscale {\n    target_inflight = 2\n  }\n"), []string{"svc.hcl:3:3: error: Autoscale without room"}},
		{"zero target", body("  replicas {\n    min = 0\n    max = 2\n  }\n  autoscale {\n    target_inflight = 0\n  }\n"), []string{"svc.hcl:8:23: error: Invalid autoscale.target_inflight"}},
		{"bad duration", body("  health {\n    initial_delay = \"soon\"\n  }\n"), []string{"svc.hcl:4:21: error: Invalid duration"}},
		{"timeout over interval", body("  health {\n    interval = \"1s\"\n    timeout = \"2s\"\n  }\n"), []string{"svc.hcl:5:15: error: Invalid health.timeout"}},
		{"reserved path", body("  route {\n    path = \"/metrics\"\n  }\n"), []string{"svc.hcl:4:12: error: Reserved route.path"}},
		{"trailing slash", body("  route {\n    path = \"/a/\"\n  }\n"), []string{"svc.hcl:4:12: error: Invalid route.path"}},
		{"bad rps", body("  route {\n    rate_limit {\n      rps = -1\n    }\n  }\n"), []string{"svc.hcl:5:13: error: Invalid rate_limit.rps"}},
		{"port in env", body("  env = { PORT = \"1\" }\n"), []string{"svc.hcl:3:9: error: Conflicting env"}},
		{"auto promote without canary", body("  update {\n    auto_promote = true\n  }\n"), []string{"svc.hcl:4:20: error: auto_promote without canaries"}},
		{"canary above max", body("  update {\n    canary = 2\n  }\n"), []string{"svc.hcl:4:14: error: Invalid update.canary"}},
		{"dot segment", body("  route {\n    path = \"/a/..\"\n  }\n"), []string{"svc.hcl:4:12: error: Invalid route.path"}},
		{"sub-second timeout", body("  health {\n    timeout = \"500ms\"\n  }\n"), []string{"svc.hcl:4:15: error: Invalid health.timeout"}},
		{"traefik with auth", body("  route {\n    traefik = true\n  }\n"), []string{"svc.hcl:4:15: error: Traefik route with auth"}},
		{"max_body not a size", body("  route {\n    max_body = \"big\"\n  }\n"), []string{"svc.hcl:4:16: error: Invalid route.max_body"}},
		{"max_body over 1GiB", body("  route {\n    max_body = \"2GiB\"\n  }\n"), []string{"svc.hcl:4:16: error: Invalid route.max_body"}},
		{"max_body zero", body("  route {\n    max_body = \"0\"\n  }\n"), []string{"svc.hcl:4:16: error: Invalid route.max_body"}},
		{"unknown attribute", body("  workers = 2\n"), []string{"svc.hcl:3:3: error: Unsupported argument"}},
		{"a train spec", "train \"t\" {\n  command = \"/bin/true\"\n}\n", []string{"svc.hcl:1:1: error: A train spec where a service spec is expected"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, files, diags := spec.LoadServiceSource([]byte(c.src), "svc.hcl", spec.Options{})
			if !diags.HasErrors() {
				t.Fatalf("no error for:\n%s", c.src)
			}
			got := spec.Format(diags, files)
			for _, w := range c.want {
				if !strings.Contains(got, w) {
					t.Errorf("errors lack %q:\n%s", w, got)
				}
			}
		})
	}
}
