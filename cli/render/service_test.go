package render_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/spec"
)

// serviceExamples are the service specs in jobspecs/examples (serve-*.hcl).
func serviceExamples(t testing.TB) []string {
	t.Helper()
	out, err := filepath.Glob(filepath.Join(examplesDir, "serve-*.hcl"))
	if err != nil || len(out) < 2 {
		t.Fatalf("want at least 2 service specs in %s, found %v (%v)", examplesDir, out, err)
	}
	return out
}

func renderService(t testing.TB, path string) []byte {
	t.Helper()
	s, files, diags := spec.LoadService(path, spec.Options{})
	if diags.HasErrors() {
		t.Fatalf("%s:\n%s", path, spec.Format(diags, files))
	}
	out, err := render.ServiceOptions{}.ServiceJobspec(s)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestServiceGolden(t *testing.T) {
	for _, p := range serviceExamples(t) {
		t.Run(filepath.Base(p), func(t *testing.T) {
			got := renderService(t, p)
			golden := goldenPath(p)
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./cli/render -run TestServiceGolden -update)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("render %s differs from %s (rerun with -update if intended):\n%s", p, golden, diff(string(want), string(got)))
			}
			if again := renderService(t, p); !bytes.Equal(got, again) {
				t.Errorf("render %s is not deterministic", p)
			}
		})
	}
}

// The rendered job holds what the gateway, Nomad and Traefik rely on.
func TestServiceJobspecContents(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(examplesDir, "serve-bert.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	s, diags := spec.ParseService(src, "serve-bert.hcl", spec.Options{Vars: []string{"version=v7"}})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	out, err := render.ServiceOptions{Namespace: "ml"}.ServiceJobspec(s)
	if err != nil {
		t.Fatal(err)
	}
	got := string(out)
	for _, want := range []string{
		`type        = "service"`,
		`namespace   = "ml"`,
		`count = 2`,
		`port "http"`,
		"min     = 1", "max     = 4",
		`canary            = 1`,
		`auto_promote      = true`,
		`auto_revert       = true`,
		`healthy_deadline  = "10m25s"`, // 10m initial delay + 5s min healthy time + 20s (10 intervals)
		`service = true`,
		`PORT = "${NOMAD_PORT_http}"`,
		`GPUJOB_SERVICE_VERSION = "v7"`,
		`"gpujob-ns=ml"`, `"gpujob-version=v7"`, `"gpujob-canary"`,
		`path     = "/healthz"`,
		`grace = "10m"`,
		`shutdown_delay = "3s"`,
		`device "nvidia/gpu"`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("rendered job lacks %s:\n%s", want, got)
		}
	}
	if strings.Contains(got, "traefik") {
		t.Errorf("Traefik tags without route { traefik = true }:\n%s", got)
	}
	// Asked for (without auth), they route Traefik the gateway's way.
	s.Route.Traefik, s.Route.Auth = true, false
	withTraefik, err := render.ServiceOptions{Namespace: "ml"}.ServiceJobspec(s)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"traefik.http.routers.ml-bert-clf.rule=PathPrefix(`/bert-clf`)",
		"traefik.http.middlewares.ml-bert-clf-strip.stripprefix.prefixes=/bert-clf"} {
		if !strings.Contains(string(withTraefik), want) {
			t.Errorf("no %s", want)
		}
	}
	if strings.Contains(got, "rendezvous") {
		t.Errorf("a service replica got a rendezvous block:\n%s", got)
	}
	healthy, progress := render.Deadlines(s)
	if healthy <= s.Health.InitialDelay || progress <= healthy {
		t.Errorf("deadlines %s/%s do not leave the initial delay %s", healthy, progress, s.Health.InitialDelay)
	}
}
