package acl

import (
	"errors"
	"strings"
	"testing"

	"github.com/hashicorp/consul/api"
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/gpujob/gpujob/internal/testagent"
)

// Every policy renders to well-formed HCL with no blank left, and the
// per-namespace ones name the namespace and nothing of another.
func TestEveryPolicyRenders(t *testing.T) {
	pols := Policies()
	if len(pols) < 10 {
		t.Fatalf("%d policies embedded, want the 10 gpujob documents at least: %+v", len(pols), pols)
	}
	for _, pol := range pols {
		out, err := Render(pol, Params{Namespace: "team-a"})
		if err != nil {
			t.Errorf("%s: %v", pol.Name, err)
			continue
		}
		if strings.Contains(string(out), "{{") || strings.Contains(string(out), "<no value>") {
			t.Errorf("%s: a blank is left:\n%s", pol.Name, out)
		}
		if _, diags := hclsyntax.ParseConfig(out, pol.File, hcl.InitialPos); diags.HasErrors() {
			t.Errorf("%s does not parse: %v\n%s", pol.Name, diags, out)
		}
		rules := rulesOnly(out)
		if pol.PerNamespace != strings.Contains(rules, "team-a") {
			t.Errorf("%s (per namespace: %v) names the namespace in its rules: %v\n%s", pol.Name, pol.PerNamespace,
				strings.Contains(rules, "team-a"), rules)
		}
		if pol.PerNamespace && strings.Contains(rules, `"*"`) {
			t.Errorf("%s grants every namespace:\n%s", pol.Name, rules)
		}
	}
	for _, name := range []string{"consul-sweeps", "consul-gpujob-sweeps", "consul-gpujob-sweeps.hcl"} {
		if p, err := Lookup(name); err != nil || p.Name != "consul-sweeps" {
			t.Errorf("Lookup(%q) = %+v, %v", name, p, err)
		}
	}
}

// rulesOnly drops a rendered policy's comments.
func rulesOnly(b []byte) string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// A bad namespace, prefix or option is refused with the rule and the
// option it breaks, never rendered into a policy that grants more.
func TestRenderRefusesBadInput(t *testing.T) {
	sweeps, _ := Lookup("consul-sweeps")
	submit, _ := Lookup("nomad-submit")
	for _, tc := range []struct {
		pol  Policy
		p    Params
		want string
	}{
		{sweeps, Params{}, `--namespace "": policy consul-sweeps is for one Nomad namespace`},
		{sweeps, Params{Namespace: "team/../b"}, `--namespace "team/../b"`},
		{sweeps, Params{Namespace: `a" { policy = "write" } key_prefix "`}, "1 to 128 letters, digits and '-'"},
		{sweeps, Params{Namespace: "*"}, `--namespace "*"`},
		{sweeps, Params{Namespace: strings.Repeat("a", 129)}, "--namespace"},
		{sweeps, Params{Namespace: "a", SweepPrefix: "gpujob//sweeps"}, `--sweep-prefix "gpujob//sweeps"`},
		{sweeps, Params{Namespace: "a", SweepPrefix: "../x"}, "--sweep-prefix"},
		{sweeps, Params{Namespace: "a", SweepPrefix: `x" {`}, "--sweep-prefix"},
		{sweeps, Params{Namespace: "a", ServicePrefix: "/abs"}, "--service-prefix"},
		{submit, Params{Namespace: "a", ReadOnly: true}, "--read-only: policy nomad-submit has no read-only form"},
	} {
		_, err := Render(tc.pol, tc.p)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Render(%s, %+v) = %v, want an error with %q", tc.pol.Name, tc.p, err, tc.want)
		}
	}
	if _, err := Lookup("consul-everything"); err == nil || !strings.Contains(err.Error(), "consul-sweeps") {
		t.Errorf("Lookup of an unknown policy: %v, want the list of known ones", err)
	}
	// A prefix given with its trailing slash is the same prefix.
	a, err1 := Render(sweeps, Params{Namespace: "a", SweepPrefix: "x/y/"})
	b, err2 := Render(sweeps, Params{Namespace: "a", SweepPrefix: "x/y"})
	if err1 != nil || err2 != nil || string(a) != string(b) || !strings.Contains(string(a), `key_prefix "x/y/a/"`) {
		t.Errorf("prefix with and without its slash: %v %v\n%s", err1, err2, a)
	}
}

// The rendered policies hold on a real Consul with default-deny ACLs: a
// namespace's user writes that namespace's sweeps and services only —
// neither another namespace's (one whose name extends its own included)
// nor the trees of other components — reads the other namespaces' routes
// (deploy's path check) but no other namespace's sweeps; a read-only token
// writes nothing.
func TestRenderedPoliciesConfineANamespace(t *testing.T) {
	checkConfinement(t, mustRender(t, "consul-sweeps", Params{Namespace: "team"}),
		mustRender(t, "consul-services", Params{Namespace: "team"}),
		mustRender(t, "consul-sweeps", Params{Namespace: "team", ReadOnly: true}),
		mustRender(t, "consul-exporter", Params{}))
}

// checkConfinement checks the rules of a namespace's sweeps, services and
// read-only sweeps policies, and the exporters', for the namespace "team".
func checkConfinement(t *testing.T, sweepsRules, servicesRules, viewerRules, exporterRules string) {
	c := aclConsul(t)
	sweepsA := tokenOf(t, c, "sweeps-team", sweepsRules)
	servicesA := tokenOf(t, c, "services-team", servicesRules)
	viewerA := tokenOf(t, c, "sweeps-team-ro", viewerRules)
	exporter := tokenOf(t, c, "exporter", exporterRules)

	for _, k := range []string{"gpujob/sweeps/team-b/x/spec", "gpujob/services/team-b/x/route", "gpujob/sweeps/team/x/state",
		"gpujob/rendezvous/team/x", "gpujob/queues/config", "gpujob/queues/jobs/team-b/x", "gpujob/queues/state/status/team-b/x",
		"gpujob/queues/state/stats"} {
		put(t, c, "", k, nil)
	}
	for _, tc := range []struct {
		who, token, op, key string
		allowed             bool
	}{
		{"team's sweeps token", sweepsA, "write", "gpujob/sweeps/team/x/spec", true},
		{"team's sweeps token", sweepsA, "write", "gpujob/sweeps/team/x/trials/trial-001/stop", true},
		{"team's sweeps token", sweepsA, "write", "gpujob/sweeps/team-b/x/spec", false},
		{"team's sweeps token", sweepsA, "write", "gpujob/sweeps/teamb/x/spec", false},
		{"team's sweeps token", sweepsA, "write", "gpujob/sweeps/other/x/state", false},
		{"team's sweeps token", sweepsA, "write", "gpujob/sweeps/team", false},
		{"team's sweeps token", sweepsA, "read", "gpujob/sweeps/team-b/x/spec", false},
		{"team's sweeps token", sweepsA, "write", "gpujob/services/team/x/route", false},
		{"team's sweeps token", sweepsA, "write", "gpujob/rendezvous/team/x", false},
		{"team's services token", servicesA, "write", "gpujob/services/team/x/route", true},
		{"team's services token", servicesA, "write", "gpujob/services/team/x/tokens/" + strings.Repeat("a", 64), true},
		{"team's services token", servicesA, "read", "gpujob/services/team-b/x/route", true},
		{"team's services token", servicesA, "write", "gpujob/services/team-b/x/route", false},
		{"team's services token", servicesA, "write", "gpujob/services/team-b/x/tokens/" + strings.Repeat("a", 64), false},
		{"team's services token", servicesA, "write", "gpujob/services/teamx/route", false},
		{"team's services token", servicesA, "write", "gpujob/gateway/leader", false},
		{"team's services token", servicesA, "write", "gpujob/sweeps/team/x/spec", false},
		{"team's read-only sweeps token", viewerA, "read", "gpujob/sweeps/team/x/state", true},
		{"team's read-only sweeps token", viewerA, "write", "gpujob/sweeps/team/x/state", false},
		{"the exporters' token", exporter, "read", "gpujob/sweeps/team-b/x/spec", true},
		{"the exporters' token", exporter, "write", "gpujob/sweeps/team-b/x/spec", false},
		{"the exporters' token", exporter, "read", "gpujob/services/team-b/x/route", false},
		{"the exporters' token", exporter, "read", "gpujob/rendezvous/team/x", false},
		{"the exporters' token", exporter, "read", "gpujob/queues/config", true},
		{"the exporters' token", exporter, "read", "gpujob/queues/jobs/team-b/x", true},
		{"the exporters' token", exporter, "read", "gpujob/queues/state/status/team-b/x", true},
		{"the exporters' token", exporter, "read", "gpujob/queues/state/stats", true},
		{"the exporters' token", exporter, "write", "gpujob/queues/config", false},
		{"the exporters' token", exporter, "write", "gpujob/queues/jobs/team-b/x", false},
		{"the exporters' token", exporter, "write", "gpujob/queues/state/stats", false},
		{"the exporters' token", exporter, "write", "gpujob/queues/state/leader", false},
	} {
		var err error
		if tc.op == "write" {
			err = put(t, c, tc.token, tc.key, nil)
		} else {
			_, _, err = client(t, c, tc.token).KV().Get(tc.key, nil)
		}
		if tc.allowed && err != nil {
			t.Errorf("%s cannot %s %s: %v", tc.who, tc.op, tc.key, err)
		}
		if !tc.allowed && !denied(err) {
			t.Errorf("%s may %s %s (%v)", tc.who, tc.op, tc.key, err)
		}
	}
	// A recursive delete of another namespace's tree is refused too
	// (gpujob service stop --purge, sweep stop --purge delete trees).
	if _, err := client(t, c, servicesA).KV().DeleteTree("gpujob/services/team-b/", nil); !denied(err) {
		t.Errorf("team's services token deleted team-b's tree: %v", err)
	}
	if p, _, err := client(t, c, "").KV().Get("gpujob/services/team-b/x/route", nil); err != nil || p == nil {
		t.Errorf("team-b's route after the refused delete: %v, %v", p, err)
	}
}

func mustRender(t *testing.T, name string, p Params) string {
	t.Helper()
	pol, err := Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Render(pol, p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

const managementToken = "6d1b2a4e-0c6b-4f7e-9d8e-5a3c1e2f4b6a"

// aclConsul is a dev Consul with default-deny ACLs. Its default token (for
// requests without one) is the management token, which its start-up probe
// needs; every request of these tests that is judged carries a token.
func aclConsul(t *testing.T) *testagent.Consul {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a Consul agent (not in -short)")
	}
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
	return c
}

func client(t *testing.T, c *testagent.Consul, token string) *api.Client {
	t.Helper()
	cfg := api.DefaultConfig()
	cfg.Address, cfg.Token = c.Addr, token
	if token == "" {
		cfg.Token = managementToken
	}
	cl, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// tokenOf creates a policy of rules and a token of it; the token's secret.
func tokenOf(t *testing.T, c *testagent.Consul, name, rules string) string {
	t.Helper()
	m := client(t, c, "")
	p, _, err := m.ACL().PolicyCreate(&api.ACLPolicy{Name: name, Rules: rules}, nil)
	if err != nil {
		t.Fatalf("Consul refuses policy %s: %v\n%s", name, err, rules)
	}
	tok, _, err := m.ACL().TokenCreate(&api.ACLToken{Policies: []*api.ACLTokenPolicyLink{{ID: p.ID}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return tok.SecretID
}

func put(t *testing.T, c *testagent.Consul, token, key string, value []byte) error {
	t.Helper()
	_, err := client(t, c, token).KV().Put(&api.KVPair{Key: key, Value: value}, nil)
	return err
}

func denied(err error) bool {
	var se api.StatusError
	return errors.As(err, &se) && se.Code == 403
}
