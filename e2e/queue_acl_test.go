package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/internal/contract"
)

// The queue on the cluster with ACLs and mutual TLS, wired as dev-up wires
// it: an operator's Consul token (consul-queues) applies the queue file and
// a user's Nomad token registers the controller, which runs as its own user
// with the tokens dev-up put into its variable; a user's Consul token
// (consul-queue-user) queues a job, the controller admits it and it runs to
// the end. The user's token cannot write the configuration, and no token
// shows in the CLI's output or the controller's log.
func TestQueueWithACLsAndTLS(t *testing.T) {
	c := secureCluster(t)
	c.nodeGPUs(t, c.gpusPerClient())
	secrets := c.secrets(t)
	mgmt := c.consulClient(t)
	const job = "e2e-queue-acl"
	t.Cleanup(func() { c.resetQueues(t, mgmt, job) })

	dir := t.TempDir()
	queues := filepath.Join(dir, "queues.hcl")
	if err := os.WriteFile(queues, []byte("queue \"default\" {\n  gpus = 4\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	user := c.secureSweepEnv(secrets["nomad-submit"], secrets["consul-queue-user"])
	operator := c.secureSweepEnv(secrets["nomad-submit"], secrets["consul-queues"])
	var everything strings.Builder

	// A user cannot apply queues.
	out, errOut, code := c.gpujobEnv(t, user, time.Minute, "queue", "apply", "--no-controller", queues)
	everything.WriteString(out + errOut)
	if code == 0 {
		t.Fatalf("a user's token applied a queue file:\n%s%s", out, errOut)
	}
	out, errOut, code = c.gpujobEnv(t, operator, 2*time.Minute, "queue", "apply", queues)
	everything.WriteString(out + errOut)
	if code != 0 || !strings.Contains(out, "registered job "+render.QueueControllerJob) || !strings.Contains(out, "as gpujob-queue") {
		t.Fatalf("queue apply by the operator exited %d:\n%s%s", code, out, errOut)
	}
	queueWait(t, 2*time.Minute, "controller leading", func() (bool, string) {
		kv, _, err := mgmt.KV().Get(contract.QueueLeaderKey, nil)
		return err == nil && kv != nil && kv.Session != "", fmt.Sprintf("%+v (%v)", kv, err)
	})

	spec := filepath.Join(dir, job+".hcl")
	if err := os.WriteFile(spec, []byte(queueTrainSpec(job, 2, 2)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = c.gpujobEnv(t, user, 3*time.Minute, "submit", spec)
	everything.WriteString(out + errOut)
	if code != 0 || !strings.Contains(out, "queued "+job+" in default") || !strings.Contains(out, "admitted by queue default") ||
		!strings.Contains(out, "complete") {
		t.Fatalf("a user's queued submit exited %d:\n%s%s", code, out, errOut)
	}
	if j, _, err := c.nomad.Jobs().Info(job, nil); err != nil || !strings.HasSuffix(j.Meta[contract.MetaAdmission], ".1") {
		t.Errorf("job %s was not registered by its first admission: %v", job, err)
	}
	// The user's Consul token cannot write the configuration.
	if _, err := c.consulClientWith(t, secrets["consul-queue-user"]).KV().Put(&consul.KVPair{Key: contract.QueueConfigKey, Value: []byte("{}")}, nil); err == nil {
		t.Errorf("a user's Consul token wrote %s", contract.QueueConfigKey)
	}
	for _, a := range c.holding(t, render.QueueControllerJob) {
		everything.WriteString(c.taskLog(t, a.ID, render.QueueControllerTask, "stderr"))
	}
	for name, secret := range secrets {
		if secret != "" && strings.Contains(everything.String(), secret) {
			t.Errorf("the secret of %s shows in the CLI's output or the controller's log", name)
		}
	}
}
