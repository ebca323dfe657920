package token

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/iostreams"
	"github.com/gpujob/gpujob/cli/servestore"
	"github.com/gpujob/gpujob/internal/servekv"
	"github.com/gpujob/gpujob/internal/testagent"
)

func run(t *testing.T, fac *factory.Factory, args ...string) (string, string, error) {
	t.Helper()
	ios, _, out, errOut := iostreams.Test()
	fac.IO = ios
	cmd := NewCmd(fac)
	cmd.SetArgs(args)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := cmd.ExecuteContext(ctx)
	return out.String(), errOut.String(), err
}

func TestTokenLifecycle(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a Consul agent (-short)")
	}
	agent, err := testagent.StartConsul("")
	if err != nil {
		t.Fatal(err)
	}
	defer agent.Stop()
	c, err := consul.NewClient(&consul.Config{Address: agent.Addr})
	if err != nil {
		t.Fatal(err)
	}
	fac := &factory.Factory{Now: func() time.Time { return time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC) },
		Consul:    func() (*consul.Client, error) { return c, nil },
		Namespace: func() string { return "default" }}

	// No route, no token: a typo in --service does not mint one.
	if _, _, err := run(t, fac, "create", "--service", "nope"); err == nil || !strings.Contains(err.Error(), "deploy it first") {
		t.Fatalf("create for a missing service: %v", err)
	}
	store, _ := servestore.Open(fac)
	if err := store.PutRoute(context.Background(), servekv.Route{Namespace: "default", Service: "svc", PathPrefix: "/svc"}); err != nil {
		t.Fatal(err)
	}
	out, _, err := run(t, fac, "create", "--service", "svc", "--name", "ci", "--rps", "5", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var created Created
	if err := json.Unmarshal([]byte(out), &created); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !strings.HasPrefix(created.Secret, servekv.SecretPrefix) || created.Limit == nil || created.Limit.Burst != 5 {
		t.Errorf("created %+v", created)
	}
	secret2, msg, err := run(t, fac, "create", "--service", "svc")
	if err != nil || !strings.Contains(msg, "shown only now") {
		t.Fatalf("%v %s", err, msg)
	}
	// The secrets are stored nowhere: only their hashes.
	pairs, _, _ := c.KV().List("", nil)
	for _, p := range pairs {
		if strings.Contains(string(p.Value), created.Secret) || strings.Contains(p.Key, created.Secret) ||
			strings.Contains(string(p.Value), strings.TrimSpace(secret2)) {
			t.Errorf("a secret is stored in %s", p.Key)
		}
	}
	out, _, err = run(t, fac, "list", "--service", "svc")
	if err != nil || !strings.Contains(out, created.ID) || !strings.Contains(out, "5/s burst 5") || strings.Contains(out, created.Secret) {
		t.Fatalf("list: %v\n%s", err, out)
	}
	if _, _, err := run(t, fac, "revoke", "--service", "svc", "abc"); err == nil {
		t.Error("revoked a token by a 3-digit prefix")
	}
	out, _, err = run(t, fac, "revoke", "--service", "svc", created.ID[:8])
	if err != nil || !strings.Contains(out, "revoked token "+created.ID) {
		t.Fatalf("revoke: %v %s", err, out)
	}
	toks, _ := store.Tokens(context.Background(), "default", "svc")
	if len(toks) != 1 || toks[0].ID == created.ID {
		t.Errorf("after revoke: %+v", toks)
	}
	if _, _, err := run(t, fac, "revoke", "--service", "svc", created.ID); err == nil {
		t.Error("revoked the same token twice")
	}
}

func TestMain(m *testing.M) { os.Exit(m.Run()) }
