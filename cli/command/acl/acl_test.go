package acl_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gpujob/gpujob/cli/command/root"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/iostreams"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	io, _, out, _ := iostreams.Test()
	cmd := root.NewCmd(&factory.Factory{IO: io, Now: time.Now})
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func TestPolicyCommand(t *testing.T) {
	t.Setenv("NOMAD_NAMESPACE", "")
	t.Setenv("GPUJOB_SWEEP_KEY_PREFIX", "")
	t.Setenv("GPUJOB_SERVICE_KEY_PREFIX", "")

	out, err := run(t, "acl", "policy", "consul-sweeps", "--namespace", "team-a")
	if err != nil || !strings.Contains(out, `key_prefix "gpujob/sweeps/team-a/" {`) || !strings.Contains(out, `policy = "write"`) {
		t.Errorf("consul-sweeps for team-a: %v\n%s", err, out)
	}
	out, err = run(t, "acl", "policy", "consul-services", "--namespace", "team-a", "--read-only", "--service-prefix", "acme/svc")
	if err != nil || !strings.Contains(out, `key_prefix "acme/svc/team-a/" {`+"\n"+`  policy = "read"`) {
		t.Errorf("read-only consul-services for team-a under acme/svc: %v\n%s", err, out)
	}

	// The namespace defaults to the CLI's, as every command's does.
	t.Setenv("NOMAD_NAMESPACE", "ml")
	out, err = run(t, "acl", "policy", "nomad-submit")
	if err != nil || !strings.Contains(out, `namespace "ml" {`) {
		t.Errorf("nomad-submit with NOMAD_NAMESPACE=ml: %v\n%s", err, out)
	}
	// The prefix defaults to the CLI's and the driver's.
	t.Setenv("GPUJOB_SWEEP_KEY_PREFIX", "acme/sweeps")
	out, err = run(t, "acl", "policy", "consul-sweeps")
	if err != nil || !strings.Contains(out, `key_prefix "acme/sweeps/ml/" {`) {
		t.Errorf("consul-sweeps with GPUJOB_SWEEP_KEY_PREFIX: %v\n%s", err, out)
	}

	if _, err := run(t, "acl", "policy", "consul-sweeps", "--namespace", "a/b"); err == nil ||
		!strings.Contains(err.Error(), `--namespace "a/b"`) {
		t.Errorf("a namespace with a slash: %v", err)
	}
	if _, err := run(t, "acl", "policy", "consul-all"); err == nil || !strings.Contains(err.Error(), "consul-sweeps") {
		t.Errorf("an unknown policy: %v", err)
	}
	// The queue controller's Nomad policy reads every node and submits in
	// every namespace, and is the same whatever the CLI's namespace.
	out, err = run(t, "acl", "policy", "nomad-queue-controller")
	if err != nil || !strings.Contains(out, `namespace "*" {`) || !strings.Contains(out, `"submit-job"`) || !strings.Contains(out, `policy = "read"`) ||
		strings.Contains(out, `namespace "ml"`) {
		t.Errorf("nomad-queue-controller: %v\n%s", err, out)
	}
	out, err = run(t, "acl", "policy")
	for _, want := range []string{"consul-sweeps", "consul-services", "nomad-submit", "consul-exporter", "nomad-exporter", "nomad-queue-controller", "consul-queue-controller", "(per namespace)"} {
		if err != nil || !strings.Contains(out, want) {
			t.Errorf("the list lacks %q: %v\n%s", want, err, out)
		}
	}
}
