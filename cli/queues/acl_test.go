package queues

import (
	"context"
	"errors"
	"strings"
	"testing"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/queue/admit"
	"github.com/gpujob/gpujob/internal/testagent"
	"github.com/gpujob/gpujob/jobspecs/acl"
)

const managementToken = "6d1b2a4e-0c6b-4f7e-9d8e-5a3c1e2f4b6a"

func aclClient(t *testing.T, c *testagent.Consul, token string) *consulapi.Client {
	t.Helper()
	cfg := consulapi.DefaultConfig()
	cfg.Address, cfg.Token = c.Addr, token
	cl, err := consulapi.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// On a Consul with default-deny ACLs, a user's token of
// consul-queue-submit for its namespace does all submit, status, list,
// queue status and stop need of the queue records — and nothing of
// another namespace's.
func TestQueueSubmitTokenSuffices(t *testing.T) {
	c, err := testagent.StartConsul(`acl {
  enabled        = true
  default_policy = "deny"
  tokens {
    initial_management = "` + managementToken + `"
    default            = "` + managementToken + `"
  }
}`)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	mgmt := aclClient(t, c, managementToken)
	pol, err := acl.Lookup("consul-queue-submit")
	if err != nil {
		t.Fatal(err)
	}
	rules, err := acl.Render(pol, acl.Params{Namespace: "ns1"})
	if err != nil {
		t.Fatal(err)
	}
	p, _, err := mgmt.ACL().PolicyCreate(&consulapi.ACLPolicy{Name: "queue-submit-ns1", Rules: string(rules)}, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, rules)
	}
	tok, _, err := mgmt.ACL().TokenCreate(&consulapi.ACLToken{Description: "alice (team ns1)", Policies: []*consulapi.ACLTokenPolicyLink{{ID: p.ID}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	user := Records{Consul: aclClient(t, c, tok.SecretID)}
	admin := Records{Consul: mgmt}
	ctx := context.Background()

	by := SubmittedBy(ctx, user.Consul)
	if by != "alice (team ns1)" {
		t.Errorf("submitted by %q, want the token's description", by)
	}
	e, err := user.Enqueue(ctx, EnqueueOptions{Job: testJob("bert"), Namespace: "ns1", Queue: "team-a", Kind: admit.KindTrain, SubmittedBy: by, Now: now})
	if err != nil {
		t.Fatalf("the namespace's token cannot queue a job: %v", err)
	}
	// The controller's status, and another namespace's job, written with
	// stronger tokens.
	putStatus(t, admin, e, admit.Status{State: admit.StateQueued, Position: 1, Reason: "waiting for 2 GPUs"})
	if _, err := admin.Enqueue(ctx, EnqueueOptions{Job: testJob("other"), Namespace: "ns2", Queue: "team-a", Kind: admit.KindTrain, SubmittedBy: "bob", Now: now}); err != nil {
		t.Fatal(err)
	}
	got, err := user.Get(ctx, "ns1", "bert")
	if err != nil || got == nil || got.State() != admit.StateQueued {
		t.Fatalf("the token cannot read its job's status: %+v %v", got, err)
	}
	l, err := user.List(ctx, "")
	if err != nil || len(l) != 1 || l[0].Record.ID != "bert" {
		t.Errorf("the listing of every namespace holds %d jobs (%v); want ns1's alone", len(l), err)
	}
	var se consulapi.StatusError
	if _, err := user.Enqueue(ctx, EnqueueOptions{Job: testJob("intruder"), Namespace: "ns2", Queue: "team-a", Kind: admit.KindTrain, SubmittedBy: by, Now: now}); !errors.As(err, &se) || se.Code != 403 {
		t.Errorf("the token queued a job into another namespace: %v", err)
	}
	if _, err := user.Consul.KV().Put(&consulapi.KVPair{Key: admit.JobKey(user.StatusPrefix(), "ns1", "bert"), Value: []byte("{}")}, nil); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("the token wrote its job's status: %v", err)
	}
	if ok, err := user.Withdraw(ctx, got); !ok || err != nil {
		t.Errorf("the token cannot withdraw its job: %v %v", ok, err)
	}
}
