package render_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpujob/gpujob/cli/render"
)

func TestQueueControllerJobspec(t *testing.T) {
	plain, err := render.QueueControllerJobspec(render.QueueController{Binary: "/usr/local/bin/gpujob",
		Env: map[string]string{"NOMAD_ADDR": "http://127.0.0.1:4646", "CONSUL_HTTP_ADDR": "127.0.0.1:8500"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`job "gpujob-queue-controller" {`, `type        = "service"`, `gpujob = "queue-controller"`,
		`group "controller" {`, `count = 1`, "restart {", `mode     = "fail"`, "reschedule {", `unlimited      = true`,
		`task "qctl" {`, `driver       = "raw_exec"`, `user         = "nobody"`, `command = "/usr/local/bin/gpujob"`,
		`args    = ["queue", "controller"]`, `NOMAD_ADDR `, `NOMAD_TOKEN `, `CONSUL_HTTP_TOKEN `} {
		if !strings.Contains(string(plain), want) {
			t.Errorf("the queue controller's job lacks %q:\n%s", want, plain)
		}
	}
	if strings.Contains(string(plain), "identity") || strings.Contains(string(plain), render.EnvQueueControllerSecrets) {
		t.Errorf("without secrets the job reads no variable:\n%s", plain)
	}
	// With secrets: its credentials from its own variable with its
	// workload identity, as a user of its own.
	secrets, err := render.QueueControllerJobspec(render.QueueController{Binary: "/usr/local/bin/gpujob", Secrets: true, Count: 2,
		Env: map[string]string{"CONSUL_HTTP_ADDR": "https://127.0.0.1:8501"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`user         = "gpujob-queue"`, `GPUJOB_QUEUE_CONTROLLER_SECRETS = "nomad/jobs/gpujob-queue-controller"`,
		"identity {", "file = true", `count = 2`} {
		if !strings.Contains(string(secrets), want) {
			t.Errorf("the queue controller's job with secrets lacks %q:\n%s", want, secrets)
		}
	}
	ns, err := render.QueueControllerJobspec(render.QueueController{Binary: "/usr/local/bin/gpujob", Namespace: "ops"})
	if err != nil || !strings.Contains(string(ns), `namespace   = "ops"`) {
		t.Errorf("a namespace: %v\n%s", err, ns)
	}
	for _, bad := range []render.QueueController{{Binary: "gpujob"}, {Binary: "/bin/gpujob", Count: -1}, {Binary: "/bin/gpujob", Count: 9}} {
		if _, err := render.QueueControllerJobspec(bad); err == nil {
			t.Errorf("%+v rendered without an error", bad)
		}
	}

	// The real `nomad job validate` accepts both.
	addr := needAgent(t)
	dir := t.TempDir()
	for name, src := range map[string][]byte{"plain": plain, "secrets": secrets} {
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
