package acl

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/queue/queuekv"
	"github.com/gpujob/gpujob/internal/testagent"
)

// No policy but consul-queues' write form grants write on the queue
// configuration's key: not the driver's token (which every supervisor,
// inside a job, holds), not a namespace's users', not the gateways' — for
// every namespace, "queues" included.
func TestOnlyTheQueuesPolicyWritesTheQueueConfig(t *testing.T) {
	checked := 0
	for _, pol := range Policies() {
		if pol.System != "consul" {
			continue
		}
		for _, ns := range []string{"default", "queues", "gpujob"} {
			for _, ro := range []bool{false, true} {
				if ro && !pol.ReadOnly {
					continue
				}
				out, err := Render(pol, Params{Namespace: ns, ReadOnly: ro})
				if err != nil {
					t.Fatalf("%s: %v", pol.Name, err)
				}
				writes := writeRules(t, pol.Name, out)
				checked++
				owner := pol.Name == "consul-queues" && !ro
				if owner != writes {
					t.Errorf("%s (namespace %s, read-only %v) grants write on %s: %v, want %v\n%s",
						pol.Name, ns, ro, contract.QueueConfigKey, writes, owner, out)
				}
			}
		}
	}
	if checked < 8 {
		t.Fatalf("checked %d renderings: the Consul policies moved", checked)
	}
}

// writeRules reports whether a rendered Consul policy grants write on
// contract.QueueConfigKey, by a key or key_prefix rule.
func writeRules(t *testing.T, name string, src []byte) bool {
	t.Helper()
	f, diags := hclsyntax.ParseConfig(src, name, hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatalf("%s: %v", name, diags)
	}
	grants := false
	for _, b := range f.Body.(*hclsyntax.Body).Blocks {
		if (b.Type != "key" && b.Type != "key_prefix") || len(b.Labels) != 1 {
			continue
		}
		a := b.Body.Attributes["policy"]
		if a == nil {
			continue
		}
		v, d := a.Expr.Value(nil)
		if d.HasErrors() || v.AsString() != "write" {
			continue
		}
		label := b.Labels[0]
		if (b.Type == "key" && label == contract.QueueConfigKey) ||
			(b.Type == "key_prefix" && strings.HasPrefix(contract.QueueConfigKey, label)) {
			grants = true
		}
	}
	return grants
}

// A prefix whose namespace trees could be, or hold, the queues' tree is
// refused: with --sweep-prefix gpujob the namespace "queues" would own
// gpujob/queues/.
func TestRenderRefusesAPrefixOverTheQueues(t *testing.T) {
	sweeps, _ := Lookup("consul-sweeps")
	services, _ := Lookup("consul-services")
	for _, p := range []Params{
		{Namespace: "queues", SweepPrefix: "gpujob"},
		{Namespace: "a", ServicePrefix: "gpujob/queues"},
		{Namespace: "a", SweepPrefix: "gpujob/queues/sub"},
	} {
		for _, pol := range []Policy{sweeps, services} {
			if _, err := Render(pol, p); err == nil || !strings.Contains(err.Error(), "queue configuration") {
				t.Errorf("Render(%s, %+v) = %v, want a refusal", pol.Name, p, err)
			}
		}
	}
	if _, err := Render(sweeps, Params{Namespace: "a", SweepPrefix: "gpujob/queuesx"}); err != nil {
		t.Errorf("a sibling prefix: %v", err)
	}
}

// On a real Consul with default-deny ACLs: the queue policy's write form
// applies a configuration (the check-and-set transaction gpujob queue
// apply makes), its read-only form reads it and writes nothing, and the
// driver's, a namespace's and the gateways' tokens can neither write it
// nor delete it.
func TestQueueConfigTokens(t *testing.T) {
	c := aclConsul(t)
	admin := tokenOf(t, c, "queues-admin", mustRender(t, "consul-queues", Params{}))
	reader := tokenOf(t, c, "queues-read", mustRender(t, "consul-queues", Params{ReadOnly: true}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rec := &queuekv.Record{Format: queuekv.Format, Queues: []queuekv.Queue{{Name: "default", Weight: 1, Priority: 50}},
		File: "q.hcl", SHA256: strings.Repeat("0", 64), AppliedBy: "ops@host", AppliedAt: time.Unix(1, 0).UTC()}
	if _, err := queuekv.New(client(t, c, reader), "").Write(ctx, rec, 0); err == nil {
		t.Fatal("the read-only token applied a configuration")
	}
	idx, err := queuekv.New(client(t, c, admin), "").Write(ctx, rec, 0)
	if err != nil {
		t.Fatalf("the queues' admin token cannot apply: %v", err)
	}
	if r, _, err := queuekv.New(client(t, c, reader), "").Read(ctx); err != nil || r == nil {
		t.Fatalf("the read-only token cannot read it: %v %v", r, err)
	}
	for _, name := range []string{"consul-driver", "consul-gateway", "consul-exporter", "consul-nomad-agent"} {
		checkCannotWrite(t, c, name, tokenOf(t, c, name, mustRender(t, name, Params{})))
	}
	for _, name := range []string{"consul-sweeps", "consul-services"} {
		checkCannotWrite(t, c, name, tokenOf(t, c, name+"-queues", mustRender(t, name, Params{Namespace: "queues"})))
	}
	if r, i, err := queuekv.New(client(t, c, ""), "").Read(ctx); err != nil || r == nil || i != idx {
		t.Fatalf("after the refused writes: %+v at %d (wrote at %d), %v", r, i, idx, err)
	}
}

func checkCannotWrite(t *testing.T, c *testagent.Consul, who, token string) {
	t.Helper()
	cl := client(t, c, token)
	if _, err := cl.KV().Put(&api.KVPair{Key: contract.QueueConfigKey, Value: []byte("{}")}, nil); !denied(err) {
		t.Errorf("%s's token may write %s: %v", who, contract.QueueConfigKey, err)
	}
	if _, err := cl.KV().DeleteTree(contract.QueuePrefix+"/", nil); !denied(err) {
		t.Errorf("%s's token may delete %s/: %v", who, contract.QueuePrefix, err)
	}
}

// grantsWrite reports whether a rendered Consul policy grants write on key,
// by a key or key_prefix rule.
func grantsWrite(t *testing.T, name string, src []byte, key string) bool {
	t.Helper()
	f, diags := hclsyntax.ParseConfig(src, name, hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatalf("%s: %v", name, diags)
	}
	for _, b := range f.Body.(*hclsyntax.Body).Blocks {
		if (b.Type != "key" && b.Type != "key_prefix") || len(b.Labels) != 1 {
			continue
		}
		a := b.Body.Attributes["policy"]
		if a == nil {
			continue
		}
		if v, d := a.Expr.Value(nil); d.HasErrors() || v.AsString() != "write" {
			continue
		}
		if (b.Type == "key" && b.Labels[0] == key) || (b.Type == "key_prefix" && strings.HasPrefix(key, b.Labels[0])) {
			return true
		}
	}
	return false
}

// The queue state (statuses, the leader key) is written by the
// controller's policy alone; a queued job's record in namespace team-a by
// the controller's and team-a's queue-submit policy alone — not the
// driver's token, not another namespace's, not the read-only forms.
func TestOnlyTheControllerWritesTheQueueState(t *testing.T) {
	keys := map[string]func(pol string, ns string, ro bool) bool{
		contract.QueueStatusPrefix + "/team-a/job": func(pol, _ string, ro bool) bool { return pol == "consul-queue-controller" },
		contract.QueueLeaderKey:                    func(pol, _ string, ro bool) bool { return pol == "consul-queue-controller" },
		contract.QueueJobsPrefix + "/team-a/job": func(pol, ns string, ro bool) bool {
			return pol == "consul-queue-controller" || (pol == "consul-queue-submit" && ns == "team-a" && !ro)
		},
	}
	checked := 0
	for _, pol := range Policies() {
		if pol.System != "consul" {
			continue
		}
		for _, ns := range []string{"team-a", "team-b", "queues", "state", "jobs"} {
			for _, ro := range []bool{false, true} {
				if ro && !pol.ReadOnly {
					continue
				}
				out, err := Render(pol, Params{Namespace: ns, ReadOnly: ro})
				if err != nil {
					t.Fatalf("%s: %v", pol.Name, err)
				}
				for key, want := range keys {
					checked++
					if got, w := grantsWrite(t, pol.Name, out, key), want(pol.Name, ns, ro); got != w {
						t.Errorf("%s (namespace %s, read-only %v) grants write on %s: %v, want %v\n%s", pol.Name, ns, ro, key, got, w, out)
					}
				}
			}
		}
	}
	if checked < 30 {
		t.Fatalf("checked %d: the Consul policies moved", checked)
	}
}

// On a real Consul with default-deny ACLs: the controller's token writes
// a status and deletes a record; team-a's submit token writes team-a's
// record but neither a status nor team-b's record; the driver's token
// writes none of them.
func TestQueueStateTokens(t *testing.T) {
	c := aclConsul(t)
	ctl := client(t, c, tokenOf(t, c, "queue-controller", mustRender(t, "consul-queue-controller", Params{})))
	sub := client(t, c, tokenOf(t, c, "queue-submit-team-a", mustRender(t, "consul-queue-submit", Params{Namespace: "team-a"})))
	drv := client(t, c, tokenOf(t, c, "driver-q", mustRender(t, "consul-driver", Params{})))
	put := func(cl *api.Client, key string) error {
		_, err := cl.KV().Put(&api.KVPair{Key: key, Value: []byte("{}")}, nil)
		return err
	}
	record, status := contract.QueueJobsPrefix+"/team-a/j", contract.QueueStatusPrefix+"/team-a/j"
	if err := put(sub, record); err != nil {
		t.Fatalf("team-a's submit token cannot queue a job: %v", err)
	}
	if _, _, err := sub.KV().Get(status, nil); err != nil {
		t.Fatalf("team-a's submit token cannot read its statuses: %v", err)
	}
	for _, k := range []string{status, contract.QueueLeaderKey, contract.QueueJobsPrefix + "/team-b/j"} {
		if err := put(sub, k); !denied(err) {
			t.Errorf("team-a's submit token may write %s: %v", k, err)
		}
	}
	for _, k := range []string{record, status, contract.QueueLeaderKey} {
		if err := put(drv, k); !denied(err) {
			t.Errorf("the driver's token may write %s: %v", k, err)
		}
	}
	if err := put(ctl, status); err != nil {
		t.Fatalf("the controller's token cannot write a status: %v", err)
	}
	if _, err := ctl.KV().Delete(record, nil); err != nil {
		t.Fatalf("the controller's token cannot delete a record: %v", err)
	}
	if err := put(ctl, contract.QueueConfigKey); !denied(err) {
		t.Errorf("the controller's token may write the queue configuration: %v", err)
	}
}
