package exporter_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gpujob/gpujob/cli/command/root"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/iostreams"
)

func render(t *testing.T, args ...string) string {
	t.Helper()
	io, _, out, _ := iostreams.Test()
	cmd := root.NewCmd(&factory.Factory{IO: io, Now: time.Now})
	cmd.SetArgs(append([]string{"exporter", "render", "--binary", "/usr/local/bin/gpujob"}, args...))
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// With --secrets the exporters take their tokens and Consul TLS material
// from their variable, and Nomad through their Task API socket: the job
// names none of the CLI's files (the exporters' user could not read them)
// and no token; without, it passes the CLI's addresses and files on.
func TestRenderWithSecrets(t *testing.T) {
	for k, v := range map[string]string{"CONSUL_HTTP_ADDR": "https://127.0.0.1:8501", "CONSUL_CACERT": "/etc/consul/ca.pem",
		"CONSUL_CLIENT_KEY": "/root/cli-key.pem", "NOMAD_ADDR": "https://127.0.0.1:4646", "NOMAD_CACERT": "/etc/nomad/ca.pem",
		"NOMAD_TOKEN": "secret-nomad-token", "CONSUL_HTTP_TOKEN": "secret-consul-token"} {
		t.Setenv(k, v)
	}
	plain := render(t)
	for _, want := range []string{"/etc/consul/ca.pem", "/root/cli-key.pem", "https://127.0.0.1:4646", `user   = "nobody"`} {
		if !strings.Contains(plain, want) {
			t.Errorf("without --secrets the job lacks %q:\n%s", want, plain)
		}
	}
	secrets := render(t, "--secrets")
	for _, bad := range []string{"/etc/consul/ca.pem", "/root/cli-key.pem", "/etc/nomad/ca.pem", "https://127.0.0.1:4646"} {
		if strings.Contains(secrets, bad) {
			t.Errorf("with --secrets the job names %q:\n%s", bad, secrets)
		}
	}
	for _, want := range []string{"https://127.0.0.1:8501", `GPUJOB_EXPORTER_SECRETS = "nomad/jobs/gpujob-exporter"`, `user   = "gpujob-exporter"`} {
		if !strings.Contains(secrets, want) {
			t.Errorf("with --secrets the job lacks %q:\n%s", want, secrets)
		}
	}
	for _, out := range []string{plain, secrets} {
		if strings.Contains(out, "secret-nomad-token") || strings.Contains(out, "secret-consul-token") {
			t.Errorf("the job holds the CLI's token:\n%s", out)
		}
	}
}
