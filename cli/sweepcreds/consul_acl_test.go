package sweepcreds

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/queue/queuekv"
	"github.com/gpujob/gpujob/internal/sweep/controller"
	"github.com/gpujob/gpujob/internal/testagent"
)

const testManagementToken = "3f0c5d1e-8a7b-4c2d-9e6f-1a2b3c4d5e6f"

// A controller's token, on a real Consul with default-deny ACLs, does in
// the queues' tree what queue mode needs and nothing else: it queues,
// reads and withdraws its own trials' records in its namespace, reads
// their statuses and the configuration; it cannot write another sweep's
// or namespace's records, any status, or the configuration.
func TestControllerTokenInTheQueuesTree(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a Consul agent (not in -short)")
	}
	agent, err := testagent.StartConsul(`acl {
  enabled        = true
  default_policy = "deny"
  tokens {
    initial_management = "` + testManagementToken + `"
    default            = "` + testManagementToken + `"
  }
}`)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(agent.Stop)
	newClient := func(token string) *consul.Client {
		cfg := consul.DefaultConfig()
		cfg.Address, cfg.Token = agent.Addr, token
		c, err := consul.NewClient(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	admin := newClient(testManagementToken)
	p, _, err := admin.ACL().PolicyCreate(&consul.ACLPolicy{Name: "sweep-lr", Rules: ConsulRules("gpujob/sweeps", "team-a", "lr")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tok, _, err := admin.ACL().TokenCreate(&consul.ACLToken{Policies: []*consul.ACLTokenPolicyLink{{ID: p.ID}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(tok.SecretID)
	kv := c.KV()
	ctx := context.Background()

	// What the admission controller and gpujob queue apply write.
	rec := &queuekv.Record{Format: queuekv.Format, Queues: []queuekv.Queue{{Name: "default", Weight: 1, Priority: 50}},
		File: "q.hcl", SHA256: strings.Repeat("0", 64), AppliedBy: "ops@host", AppliedAt: time.Unix(1, 0).UTC()}
	if _, err := queuekv.New(admin, "").Write(ctx, rec, 0); err != nil {
		t.Fatal(err)
	}
	status := contract.QueueStatusPrefix + "/team-a/lr-trial-001"
	if _, err := admin.KV().Put(&consul.KVPair{Key: status, Value: []byte("{}")}, nil); err != nil {
		t.Fatal(err)
	}

	if r, _, err := queuekv.New(c, "").Read(ctx); err != nil || r == nil {
		t.Errorf("the controller cannot read the queue configuration: %v %v", r, err)
	}
	own := contract.QueueJobsPrefix + "/team-a/lr-trial-001"
	if ok, _, err := kv.CAS(&consul.KVPair{Key: own, Value: []byte("{}")}, nil); err != nil || !ok {
		t.Fatalf("the controller cannot queue its trial: %v %v", ok, err)
	}
	if pairs, _, err := kv.List(contract.QueueJobsPrefix+"/team-a/lr-trial-", nil); err != nil || len(pairs) != 1 {
		t.Errorf("listing its trials' records: %d, %v", len(pairs), err)
	}
	if pairs, _, err := kv.List(contract.QueueStatusPrefix+"/team-a/lr-trial-", nil); err != nil || len(pairs) != 1 {
		t.Errorf("listing its trials' statuses: %d, %v", len(pairs), err)
	}
	if n, err := controller.DeleteTrialRecords(ctx, c, "", "team-a", "lr"); err != nil || n != 1 {
		t.Errorf("withdrawing its trials' records: %d, %v", n, err)
	}

	for _, key := range []string{
		contract.QueueJobsPrefix + "/team-b/lr-trial-001", // another namespace
		contract.QueueJobsPrefix + "/team-a/bert-001",     // another job of its namespace
		status,                                 // the admission controller's
		contract.QueueLeaderKey,                // the admission controller's
		contract.QueueConfigKey,                // gpujob queue apply's
		contract.QueuePrefix + "/jobs/team-a/", // not a record
	} {
		if _, err := kv.Put(&consul.KVPair{Key: key, Value: []byte("{}")}, nil); !denied(err) {
			t.Errorf("the controller's token may write %s: %v", key, err)
		}
	}
	if _, err := kv.DeleteTree(contract.QueuePrefix+"/", nil); !denied(err) {
		t.Errorf("the controller's token may delete the queues' tree: %v", err)
	}
}

func denied(err error) bool {
	var se consul.StatusError
	return err != nil && (errors.As(err, &se) && se.Code == http.StatusForbidden || strings.Contains(err.Error(), "Permission denied"))
}
