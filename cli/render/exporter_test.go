package render_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpujob/gpujob/cli/render"
)

func TestExporterJobspec(t *testing.T) {
	static, err := render.ExporterJobspec(render.Exporter{Binary: "/usr/local/bin/gpujob", Port: render.DefaultExporterPort,
		Env: map[string]string{"NOMAD_ADDR": "http://127.0.0.1:4646"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`type        = "system"`, `static = 9400`, `"exporter", "run", "--listen", "${NOMAD_ADDR_metrics}", "--node", "${node.unique.id}"`,
		`name     = "gpujob-exporter"`, `path     = "/-/healthz"`, `user   = "nobody"`, `NOMAD_ADDR `, `= "http://127.0.0.1:4646"`, `NOMAD_TOKEN `} {
		if !strings.Contains(string(static), want) {
			t.Errorf("the exporter's job lacks %q:\n%s", want, static)
		}
	}
	dynamic, err := render.ExporterJobspec(render.Exporter{Binary: "/usr/local/bin/gpujob"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(dynamic), "static") {
		t.Errorf("port 0 must leave the port to Nomad:\n%s", dynamic)
	}
	// With --secrets: the credentials come from the job's own variable
	// through the workload identity, as a user of its own; no token and no
	// TLS file in the job.
	secrets, err := render.ExporterJobspec(render.Exporter{Binary: "/usr/local/bin/gpujob", Secrets: true,
		Env: map[string]string{"CONSUL_HTTP_ADDR": "https://127.0.0.1:8501"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`user   = "gpujob-exporter"`, `GPUJOB_EXPORTER_SECRETS = "nomad/jobs/gpujob-exporter"`,
		"identity {", "env  = false", "file = true", `task "exp" {`, `NOMAD_TOKEN             = ""`, `CONSUL_HTTP_TOKEN       = ""`} {
		if !strings.Contains(string(secrets), want) {
			t.Errorf("the exporter's job with secrets lacks %q:\n%s", want, secrets)
		}
	}
	for _, bad := range []render.Exporter{{Binary: "gpujob"}, {Binary: "/bin/gpujob", Port: 70000}, {Binary: "/bin/gpujob", Port: -1}} {
		if _, err := render.ExporterJobspec(bad); err == nil {
			t.Errorf("%+v rendered without an error", bad)
		}
	}

	// The real `nomad job validate` accepts both.
	addr := needAgent(t)
	dir := t.TempDir()
	for name, src := range map[string][]byte{"static": static, "dynamic": dynamic, "secrets": secrets} {
		p := filepath.Join(dir, name+".nomad.hcl")
		if err := os.WriteFile(p, src, 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(agent.bin, "job", "validate", "-no-color", p)
		cmd.Env = append(os.Environ(), "NOMAD_ADDR="+addr)
		if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "Job validation successful") {
			t.Errorf("nomad job validate (%s): %v\n%s", name, err, out)
		}
	}
}
