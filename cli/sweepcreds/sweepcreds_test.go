package sweepcreds

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"

	consul "github.com/hashicorp/consul/api"
	hcl1 "github.com/hashicorp/hcl"
	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/nomadapi"
)

// fakeConsul is Consul's ACL system in memory.
type fakeConsul struct {
	enabled  bool
	policies map[string]string // name -> ID
	rules    map[string]string // name -> rules
	tokens   map[string]string // accessor -> policy ID
	secrets  map[string]string // accessor -> secret
	fail     map[string]error
	n        int
}

func newFakeConsul() *fakeConsul {
	return &fakeConsul{enabled: true, policies: map[string]string{}, rules: map[string]string{}, tokens: map[string]string{},
		secrets: map[string]string{}, fail: map[string]error{}}
}

func (c *fakeConsul) ACLEnabled() (bool, error) { return c.enabled, c.fail["ACLEnabled"] }
func (c *fakeConsul) CanAdminister() error      { return c.fail["CanAdminister"] }

func (c *fakeConsul) UpsertPolicy(name, _, rules string) (string, error) {
	if err := c.fail["UpsertPolicy"]; err != nil {
		return "", err
	}
	if _, ok := c.policies[name]; !ok {
		c.n++
		c.policies[name] = fmt.Sprintf("policy-%d", c.n)
	}
	c.rules[name] = rules
	return c.policies[name], nil
}

func (c *fakeConsul) CreateToken(_, policyID string) (string, string, error) {
	if err := c.fail["CreateToken"]; err != nil {
		return "", "", err
	}
	c.n++
	a := fmt.Sprintf("accessor-%d", c.n)
	c.tokens[a], c.secrets[a] = policyID, fmt.Sprintf("secret-%d", c.n)
	return a, c.secrets[a], nil
}

func (c *fakeConsul) DeletePolicyAndTokens(name string) error {
	if err := c.fail["DeletePolicyAndTokens"]; err != nil {
		return err
	}
	id, ok := c.policies[name]
	if !ok {
		return nil
	}
	for a, p := range c.tokens {
		if p == id {
			delete(c.tokens, a)
		}
	}
	delete(c.policies, name)
	delete(c.rules, name)
	return nil
}

func newIssuer(mode Mode) (*Issuer, *nomadapi.Fake, *fakeConsul) {
	n, c := nomadapi.NewFake(), newFakeConsul()
	n.SetACLEnabled(mode.Nomad)
	c.enabled = mode.Consul
	return &Issuer{Nomad: n, Consul: c, Mode: mode, Namespace: "default", Sweep: "bert-lr", KeyPrefix: "gpujob/sweeps",
		JobID: "bert-lr-controller", RecordDigest: "d1"}, n, c
}

func TestPolicyNamesFitNomadAndConsulAndNeverCollide(t *testing.T) {
	nomadName := regexp.MustCompile(`^[a-zA-Z0-9-]{1,128}$`)
	consulName := regexp.MustCompile(`^[A-Za-z0-9\-_]{1,128}$`)
	seen := map[string]string{}
	for _, c := range [][2]string{
		{"default", "bert-lr"}, {"default-bert", "lr"}, {"default", "bert.lr"}, {"default", "bert_lr"},
		{"team-a", strings.Repeat("x", 117)}, {"team-a", strings.Repeat("x", 116) + "y"}, {"ns", "ünïcode"},
	} {
		name := PolicyName(c[0], c[1])
		if !nomadName.MatchString(name) || !consulName.MatchString(name) {
			t.Errorf("PolicyName(%q, %q) = %q: not a valid Nomad and Consul policy name", c[0], c[1], name)
		}
		if prev, ok := seen[name]; ok {
			t.Errorf("PolicyName(%q, %q) = %q, the same as for %s", c[0], c[1], name, prev)
		}
		seen[name] = c[0] + "/" + c[1]
	}
	if got := PolicyName("default", "bert-lr"); !strings.HasPrefix(got, "gpujob-sweep-default-bert-lr-") {
		t.Errorf("PolicyName is not readable: %q", got)
	}
}

func TestRulesAreValidHCLAndConfinedToTheSweep(t *testing.T) {
	// Nomad and Consul parse ACL rules with HCL 1.
	for name, src := range map[string]string{"nomad": NomadRules("team-a"), "consul": ConsulRules("gpujob/sweeps", "team-a", "bert/lr")} {
		var rules map[string]any
		if err := hcl1.Decode(&rules, src); err != nil || len(rules) == 0 {
			t.Errorf("%s rules do not parse as HCL 1: %v\n%s", name, err, src)
		}
	}
	n := NomadRules("team-a")
	if !strings.Contains(n, `namespace "team-a"`) || !strings.Contains(n, `["submit-job", "read-job", "list-jobs"]`) ||
		strings.Contains(n, "node") || strings.Contains(n, "policy =") {
		t.Errorf("Nomad rules grant more or less than the launcher needs:\n%s", n)
	}
	c := ConsulRules("gpujob/sweeps", "team-a", "bert/lr")
	// The sweep's name is encoded (a slash would reach another tree) and
	// the prefix ends in a slash (no sibling sweep "bert/lr2").
	if !strings.Contains(c, `key_prefix "gpujob/sweeps/team-a/bert~2Flr/"`) {
		t.Errorf("Consul rules do not confine the keys to the sweep's own tree:\n%s", c)
	}
	if strings.Count(c, "policy") != 5 || strings.Contains(c, "acl") || strings.Contains(c, "service") || strings.Contains(c, "node ") {
		t.Errorf("Consul rules grant more than keys and sessions:\n%s", c)
	}
	// Queue mode: write on its own trials' queue records, in its own
	// namespace; read on their statuses and the configuration; nothing
	// else of the queues' tree (the state is the admission controller's).
	var rules struct {
		Key       map[string]struct{ Policy string } `hcl:"key"`
		KeyPrefix map[string]struct{ Policy string } `hcl:"key_prefix"`
	}
	if err := hcl1.Decode(&rules, c); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"gpujob/sweeps/team-a/bert~2Flr/":                  "write",
		"gpujob/queues/jobs/team-a/bert/lr-trial-":         "write",
		"gpujob/queues/state/status/team-a/bert/lr-trial-": "read",
		"key gpujob/queues/config":                         "read",
	}
	got := map[string]string{}
	for k, v := range rules.KeyPrefix {
		got[k] = v.Policy
	}
	for k, v := range rules.Key {
		got["key "+k] = v.Policy
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Consul key rules %v, want %v:\n%s", got, want, c)
	}
	for k := range got {
		if strings.HasPrefix(k, "gpujob/queues/") && !strings.Contains(k, "/team-a/bert/lr-trial-") {
			t.Errorf("rule %q reaches beyond the sweep's own trials", k)
		}
	}
}

func TestIssueMakesTokensOfOnePolicyAndHandsThemOver(t *testing.T) {
	is, n, c := newIssuer(Mode{Nomad: true, Consul: true})
	is.ConsulTLS = TLS{CA: []byte("CA PEM"), Cert: []byte("CERT PEM"), Key: []byte("KEY PEM")}
	if err := is.Issue(); err != nil {
		t.Fatal(err)
	}
	name := PolicyName("default", "bert-lr")
	if p := n.ACLPolicies()[name]; p == nil || p.Rules != NomadRules("default") {
		t.Fatalf("Nomad policy %s: %+v", name, p)
	}
	toks := n.Tokens()
	if len(toks) != 1 {
		t.Fatalf("Nomad tokens: %+v", toks)
	}
	for _, tok := range toks {
		if tok.Type != "client" || len(tok.Policies) != 1 || tok.Policies[0] != name {
			t.Errorf("token %+v: want a client token of the one policy", tok)
		}
	}
	if c.rules[name] != ConsulRules("gpujob/sweeps", "default", "bert-lr") || len(c.tokens) != 1 {
		t.Fatalf("Consul policy %q, tokens %v", c.rules[name], c.tokens)
	}

	creds, err := Fetch(n, "nomad/jobs/bert-lr-controller")
	if err != nil {
		t.Fatal(err)
	}
	var consulAccessor string
	for a := range c.tokens {
		consulAccessor = a
	}
	for _, tok := range toks {
		if creds.NomadToken != tok.SecretID {
			t.Errorf("fetched Nomad token %q, want the issued %q", creds.NomadToken, tok.SecretID)
		}
	}
	if creds.ConsulToken != c.secrets[consulAccessor] || string(creds.ConsulTLS.Key) != "KEY PEM" || string(creds.ConsulTLS.CA) != "CA PEM" {
		t.Errorf("fetched %+v", creds)
	}
}

func TestIssueReplacesLeftoversOfAnEarlierSweep(t *testing.T) {
	is, n, c := newIssuer(Mode{Nomad: true, Consul: true})
	if err := is.Issue(); err != nil {
		t.Fatal(err)
	}
	// The variable is lost (deleted by hand): the tokens are found by name
	// and by policy all the same.
	if err := n.DeleteVariable(VariablePath(is.JobID)); err != nil {
		t.Fatal(err)
	}
	if err := is.Issue(); err != nil {
		t.Fatal(err)
	}
	if len(n.Tokens()) != 1 || len(c.tokens) != 1 {
		t.Errorf("after a second Issue: Nomad tokens %d, Consul tokens %d; want the old ones revoked", len(n.Tokens()), len(c.tokens))
	}
}

func TestAFailedIssueLeavesNothing(t *testing.T) {
	is, n, c := newIssuer(Mode{Nomad: true, Consul: true})
	c.fail["CreateToken"] = &ConsulRefusal{Op: "creating an ACL token", Err: errors.New("Permission denied")}
	err := is.Issue()
	if err == nil || !strings.Contains(err.Error(), `acl = "write"`) {
		t.Fatalf("want the Consul refusal with what to do, got %v", err)
	}
	if len(n.Tokens()) != 0 || len(n.ACLPolicies()) != 0 || len(n.Variables()) != 0 || len(c.policies) != 0 {
		t.Errorf("left behind: Nomad tokens %v, policies %v, variables %v; Consul policies %v",
			n.Tokens(), n.ACLPolicies(), n.Variables(), c.policies)
	}
}

func TestRevokeRemovesEverythingAndIsIdempotent(t *testing.T) {
	is, n, c := newIssuer(Mode{Nomad: true, Consul: true})
	if err := is.Issue(); err != nil {
		t.Fatal(err)
	}
	// Another sweep's credentials are not touched.
	other := *is
	other.Sweep, other.JobID = "bert-lr2", "bert-lr2-controller"
	if err := other.Issue(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := is.Revoke(); err != nil {
			t.Fatalf("Revoke #%d: %v", i+1, err)
		}
	}
	if len(n.Tokens()) != 1 || len(n.ACLPolicies()) != 1 || len(n.Variables()) != 1 || len(c.tokens) != 1 || len(c.policies) != 1 {
		t.Errorf("after Revoke: Nomad tokens %d, policies %d, variables %d; Consul tokens %d, policies %d; want only the other sweep's",
			len(n.Tokens()), len(n.ACLPolicies()), len(n.Variables()), len(c.tokens), len(c.policies))
	}
	if _, ok := n.Variables()[VariablePath("bert-lr2-controller")]; !ok {
		t.Error("the other sweep's variable was removed")
	}
}

func TestEnsureKeepsCredentialsInUse(t *testing.T) {
	is, n, _ := newIssuer(Mode{Nomad: true})
	if err := is.Ensure(); err != nil {
		t.Fatal(err)
	}
	first := n.Variables()[VariablePath(is.JobID)].Items[itemNomadToken]
	if err := is.Ensure(); err != nil {
		t.Fatal(err)
	}
	if again := n.Variables()[VariablePath(is.JobID)].Items[itemNomadToken]; again != first || len(n.Tokens()) != 1 {
		t.Errorf("Ensure replaced the running controller's token (%q -> %q, %d tokens)", first, again, len(n.Tokens()))
	}
}

func TestWithoutACLsNothingIsMade(t *testing.T) {
	is, n, c := newIssuer(Mode{})
	if err := is.Issue(); err != nil {
		t.Fatal(err)
	}
	if len(n.Variables()) != 0 || len(n.ACLPolicies()) != 0 || len(c.policies) != 0 {
		t.Error("credentials were made for a cluster without ACLs")
	}
}

func TestRefusalsSayWhichTokenToUse(t *testing.T) {
	is, _, _ := newIssuer(Mode{Nomad: true})
	is.Nomad.(*nomadapi.Fake).Fail("ACLTokens", &nomadapi.PermissionError{Op: "listing ACL tokens", Address: "http://n:4646",
		TokenSet: true, TokenName: "alice", TokenPolicies: []string{"gpujob-submit"}})
	err := is.Issue()
	for _, want := range []string{"only a management token", `"alice" of policies gpujob-submit`, "http://n:4646"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
	// Other failures pass through as they are.
	is, _, c := newIssuer(Mode{Consul: true})
	boom := errors.New("connection refused")
	c.fail["CanAdminister"] = boom
	if err := is.Issue(); !errors.Is(err, boom) || strings.Contains(err.Error(), "acl = ") {
		t.Errorf("a transport error became %v", err)
	}
}

func TestFetchSaysWhenTheCredentialsAreGone(t *testing.T) {
	_, err := Fetch(nomadapi.NewFake(), "nomad/jobs/x-controller")
	if err == nil || !strings.Contains(err.Error(), "purged") {
		t.Errorf("got %v", err)
	}
}

func TestConsulNotFoundIsNotARefusedToken(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{consul.StatusError{Code: 404, Body: "Cannot find token to delete"}, true},
		{consul.StatusError{Code: 403, Body: "ACL not found"}, false}, // the request's own token, on a read
		{consul.StatusError{Code: 403, Body: "Permission denied: token with AccessorID 'x' lacks permission 'acl:write'"}, false},
		{nil, false},
	} {
		if got := consulNotFound(c.err); got != c.want {
			t.Errorf("consulNotFound(%v) = %v, want %v", c.err, got, c.want)
		}
	}
	if _, ok := wrap("x", consul.StatusError{Code: 403, Body: "Permission denied"}).(*ConsulRefusal); !ok {
		t.Error("a 403 is not a ConsulRefusal")
	}
}

func TestCheckRefusesNamesTheCredentialsCannotHave(t *testing.T) {
	for _, c := range []struct{ ns, sweep, want string }{
		{"default", "bert.lr", "variable paths"},
		{"default", strings.Repeat("a", 107), "at most 106"},
		{"*", "x", "namespace"},
	} {
		is, _, _ := newIssuer(Mode{Nomad: true})
		is.Namespace, is.Sweep, is.JobID = c.ns, c.sweep, c.sweep+"-controller"
		if err := is.Check(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Check(%q, %q) = %v, want %q", c.ns, c.sweep, err, c.want)
		}
	}
	is, _, _ := newIssuer(Mode{Nomad: true})
	is.Sweep, is.JobID = strings.Repeat("a", 106), strings.Repeat("a", 106)+"-controller"
	if err := is.Check(); err != nil {
		t.Errorf("a 106-byte name: %v", err)
	}
}

func TestConsulACLsWithoutNomadsAreRefused(t *testing.T) {
	n, c := nomadapi.NewFake(), newFakeConsul()
	if _, err := Detect(n, c); err == nil || !strings.Contains(err.Error(), "enable Nomad's ACLs") {
		t.Errorf("Consul ACLs alone: %v", err)
	}
	n.SetACLEnabled(true)
	if m, err := Detect(n, c); err != nil || m != (Mode{Nomad: true, Consul: true}) {
		t.Errorf("both: %+v %v", m, err)
	}
}

// Whoever may write the variable cannot point a purge at another token,
// nor have it overwrite or delete a variable that is not the sweep's.
func TestRevokeTrustsNoAccessorAndNoForeignVariable(t *testing.T) {
	is, n, _ := newIssuer(Mode{Nomad: true, Consul: true})
	if err := is.Issue(); err != nil {
		t.Fatal(err)
	}
	n.UpsertACLPolicy(&api.ACLPolicy{Name: "ops"})
	ops, err := n.CreateACLToken(&api.ACLToken{Name: "ops", Type: "client", Policies: []string{"ops"}})
	if err != nil {
		t.Fatal(err)
	}
	path := VariablePath(is.JobID)
	v := n.Variables()[path]
	v.Items[itemNomadAccessor] = ops.AccessorID
	n.PutVariable(v)
	if err := is.Revoke(); err != nil {
		t.Fatal(err)
	}
	if _, ok := n.Tokens()[ops.AccessorID]; !ok {
		t.Error("Revoke deleted the token the variable pointed at")
	}
	if len(n.Tokens()) != 1 {
		t.Errorf("tokens after Revoke: %v; want only ops", n.Tokens())
	}

	n.PutVariable(&api.Variable{Path: path, Items: api.VariableItems{"password": "hunter2"}})
	for what, f := range map[string]func() error{"Issue": is.Issue, "Revoke": is.Revoke} {
		if err := f(); err == nil || !strings.Contains(err.Error(), "is not sweep default/bert-lr's") {
			t.Errorf("%s over a foreign variable: %v", what, err)
		}
		if got := n.Variables()[path]; got == nil || got.Items["password"] != "hunter2" {
			t.Errorf("%s changed the foreign variable: %+v", what, got)
		}
	}
}

func TestEnsureReissuesRevokedTokens(t *testing.T) {
	is, n, _ := newIssuer(Mode{Nomad: true})
	if err := is.Issue(); err != nil {
		t.Fatal(err)
	}
	for a := range n.Tokens() {
		n.DeleteACLToken(a) // revoked by hand
	}
	if err := is.Ensure(); err != nil {
		t.Fatal(err)
	}
	v := n.Variables()[VariablePath(is.JobID)]
	if tok := n.Tokens()[v.Items[itemNomadAccessor]]; tok == nil || tok.SecretID != v.Items[itemNomadToken] {
		t.Errorf("Ensure kept a variable naming a revoked token: %v, tokens %v", v.Items, n.Tokens())
	}
}

// The record's digest travels with the tokens, for the controller to check
// its record with; extend keeps the one submit recorded while the
// credentials exist (the record in Consul may have changed since), and a
// variable without one (an older submission) is issued anew.
func TestRecordDigestIsKeptWithTheCredentials(t *testing.T) {
	is, n, _ := newIssuer(Mode{Nomad: true, Consul: true})
	if err := is.Issue(); err != nil {
		t.Fatal(err)
	}
	path := VariablePath(is.JobID)
	creds, err := Fetch(n, path)
	if err != nil || creds.RecordDigest != "d1" {
		t.Fatalf("Fetch: %+v, %v; want the digest d1", creds, err)
	}
	is.RecordDigest = "d2" // what extend reads from Consul now
	if err := is.Ensure(); err != nil {
		t.Fatal(err)
	}
	if got := n.Variables()[path].Items[itemRecordDigest]; got != "d1" {
		t.Errorf("Ensure with live credentials changed the digest to %q", got)
	}
	v := n.Variables()[path]
	delete(v.Items, itemRecordDigest)
	if err := n.PutVariable(v); err != nil {
		t.Fatal(err)
	}
	if err := is.Ensure(); err != nil {
		t.Fatal(err)
	}
	if got := n.Variables()[path].Items[itemRecordDigest]; got != "d2" {
		t.Errorf("Ensure on a variable without a digest: %q, want d2 issued", got)
	}
}
