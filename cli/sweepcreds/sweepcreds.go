// Package sweepcreds gives a sweep's controller credentials of its own on a
// cluster with ACLs, limited to its sweep, and takes them back when the
// sweep is purged.
//
// What the controller gets:
//   - a Nomad ACL token whose one policy grants submit-job, read-job and
//     list-jobs in the sweep's namespace (Nomad's rules cannot name jobs:
//     that is the least it can do its work with);
//   - a Consul ACL token whose one policy grants write on the sweep's own
//     key tree and on sessions (its lock), nothing else;
//   - when the CLI talks to Consul over mutual TLS, the CLI's CA and client
//     certificate, so the controller, which runs as nobody, needs no file of
//     the node.
//
// They reach it through its workload identity. Nomad 1.6.3 gives every task
// a signed identity and lets it read the variable nomad/jobs/<its job>
// without any policy; its Job.Register endpoint, though, resolves the
// request's secret as an ACL token and refuses an identity ("ACL token is
// invalid"), so the identity cannot register trials itself. The tokens are
// therefore items of that variable, which only the controller's own tasks
// (and management tokens) can read; the controller reads them over its Task
// API socket at start (Fetch).
//
// Nomad 1.6 lets only a management token create ACL tokens and policies,
// and Consul only a token with acl = "write": submitting (and purging) a
// sweep on a cluster with ACLs takes such tokens; reading and stopping it
// does not.
package sweepcreds

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

// EnvVariable is the controller's environment variable naming the Nomad
// variable its credentials are in; unset, it uses the addresses it was given
// without tokens (a cluster without ACLs).
const EnvVariable = "GPUJOB_SWEEP_CREDENTIALS"

// The variable's items.
const (
	itemNomadToken     = "nomad_token"
	itemNomadAccessor  = "nomad_accessor"
	itemConsulToken    = "consul_token"
	itemConsulAccessor = "consul_accessor"
	itemConsulCA       = "consul_ca_pem"
	itemConsulCert     = "consul_cert_pem"
	itemConsulKey      = "consul_key_pem"
	// itemRecordDigest is the SHA-256 of the sweep's record as submit
	// wrote it (sweepjob.Record.Digest): the controller runs nothing from
	// a record that differs. Consul's ACLs cannot keep every writer of the
	// sweep's keys from the record (the task driver's token writes every
	// trial's metrics next to it); this variable only ACL administrators
	// can write.
	itemRecordDigest = "record_sha256"
	// itemOwner marks a variable as this sweep's controller's ("<ns>/<sweep>"):
	// one that lacks it is never overwritten or deleted.
	itemOwner = "gpujob_sweep"
)

// ControllerUser is the user the controller runs as with ACLs: one no
// workload runs as. Every task of a client may run as nobody (the gpujob
// driver's ranks do), and a process of the same user can read the
// controller's identity file, reach its Task API socket and trace it.
// Clients create it once (scripts/dev-up.sh does):
//
//	useradd --system --no-create-home --shell /usr/sbin/nologin gpujob-sweep
const ControllerUser = "gpujob-sweep"

// Nomad's rules for what the credentials' names must be.
var (
	validNamespace = regexp.MustCompile(`^[a-zA-Z0-9-]{1,128}$`)
	validVarPath   = regexp.MustCompile(`^[a-zA-Z0-9-_~/]{1,128}$`)
)

// Mode says which of the two clusters enforce ACLs.
type Mode struct{ Nomad, Consul bool }

// Any: the controller needs credentials.
func (m Mode) Any() bool { return m.Nomad || m.Consul }

// Detect asks both clusters whether they enforce ACLs. Consul's without
// Nomad's is refused: the controller's Consul token would have to be kept
// in a Nomad variable, which anyone who reaches Nomad's API could read.
func Detect(nomad nomadapi.API, consul Consul) (Mode, error) {
	var m Mode
	var err error
	if m.Nomad, err = nomad.ACLEnabled(); err != nil {
		return m, err
	}
	if m.Consul, err = consul.ACLEnabled(); err != nil {
		return m, err
	}
	if m.Consul && !m.Nomad {
		return m, errors.New("Consul enforces ACLs but Nomad does not: a sweep's controller needs a Consul token of its own, " +
			"and without Nomad's ACLs there is nowhere to keep it from every job (enable Nomad's ACLs)")
	}
	return m, nil
}

// VariablePath is the Nomad variable a controller job's tasks read without
// any policy (Nomad's implicit access of a workload to its job's path).
func VariablePath(controllerJobID string) string { return "nomad/jobs/" + controllerJobID }

// invalidPolicyChars are what neither Nomad's ([a-zA-Z0-9-]) nor Consul's
// ([A-Za-z0-9_-]) policy names allow.
var invalidPolicyChars = regexp.MustCompile(`[^a-zA-Z0-9-]+`)

// PolicyName is the name of the controller's policy in Nomad and in
// Consul: readable, within both's rules and their 128 bytes, and distinct
// for distinct namespace and sweep names (a hash of both ends it).
func PolicyName(namespace, sweep string) string {
	sum := sha256.Sum256([]byte(namespace + "\x00" + sweep))
	readable := strings.Trim(invalidPolicyChars.ReplaceAllString(namespace+"-"+sweep, "-"), "-")
	if len(readable) > 96 {
		readable = readable[:96]
	}
	return "gpujob-sweep-" + readable + "-" + hex.EncodeToString(sum[:5])
}

// NomadRules are the controller's Nomad policy: what its launcher does
// (register and stop trial jobs, read them and their allocations, watch
// the job list) in the sweep's namespace.
func NomadRules(namespace string) string {
	return fmt.Sprintf("namespace %s {\n  capabilities = [%q, %q, %q]\n}\n",
		strconv.Quote(namespace), nomadapi.CapSubmitJob, nomadapi.CapReadJob, nomadapi.CapListJobs)
}

// ConsulRules are the controller's Consul policy: its sweep's key tree
// (spec, state, lock, the trials' metrics and stop requests; the trailing
// slash keeps a sweep whose name extends this one's out of reach) and the
// session its lock is held with (on the node of whichever agent it talks
// to, hence the prefix "").
//
// In queue mode it also queues its trials: write on the queue records of
// its own trial jobs ("<sweep>-trial-..." in its namespace: never another
// namespace's, whose records the admission controller registers there),
// read on their statuses and on the queue configuration. Nothing else of
// the queues' tree: the state is the admission controller's alone.
func ConsulRules(keyPrefix, namespace, sweep string) string {
	trials := "/" + namespace + "/" + sweep + "-trial-"
	return fmt.Sprintf("key_prefix %s {\n  policy = \"write\"\n}\nsession_prefix \"\" {\n  policy = \"write\"\n}\n"+
		"key_prefix %s {\n  policy = \"write\"\n}\nkey_prefix %s {\n  policy = \"read\"\n}\nkey %s {\n  policy = \"read\"\n}\n",
		strconv.Quote(sweepkv.SweepKey(keyPrefix, namespace, sweep)+"/"),
		strconv.Quote(contract.QueueJobsPrefix+trials), strconv.Quote(contract.QueueStatusPrefix+trials),
		strconv.Quote(contract.QueueConfigKey))
}

// TLS is the Consul TLS material the CLI uses (PEM contents), handed to
// the controller with its token.
type TLS struct{ CA, Cert, Key []byte }

// Issuer issues and revokes one sweep's controller credentials.
type Issuer struct {
	Nomad  nomadapi.API
	Consul Consul
	Mode   Mode
	// Namespace, Sweep and KeyPrefix name the sweep; JobID is its
	// controller's job.
	Namespace, Sweep, KeyPrefix, JobID string
	ConsulTLS                          TLS
	// RecordDigest is the digest of the sweep's record, kept for the
	// controller to check the record with (Credentials.RecordDigest).
	RecordDigest string
}

func (is *Issuer) policy() string { return PolicyName(is.Namespace, is.Sweep) }

func (is *Issuer) owner() string { return is.Namespace + "/" + is.Sweep }

// Check refuses, before anything is made or removed, names the credentials
// cannot have and tokens that cannot administer ACLs: submit and purge
// call it first.
func (is *Issuer) Check() error {
	if !is.Mode.Any() {
		return nil
	}
	if !validNamespace.MatchString(is.Namespace) {
		return fmt.Errorf("namespace %q: Nomad namespaces are 1 to 128 letters, digits and '-'", is.Namespace)
	}
	if path := VariablePath(is.JobID); !validVarPath.MatchString(path) {
		return fmt.Errorf("on a cluster with ACLs, sweep %q cannot run: its controller's credentials live in the Nomad variable %q, "+
			"and variable paths are at most 128 letters, digits, '-', '_' and '~' (a sweep name of at most %d such characters)",
			is.Sweep, path, 128-len(VariablePath("-controller")))
	}
	return is.preflight()
}

func (is *Issuer) tokenName() string {
	return fmt.Sprintf("gpujob sweep %s/%s controller", is.Namespace, is.Sweep)
}

// Issue creates the controller's policies and tokens and writes them to
// its variable, after revoking any left by an earlier sweep of the name.
// On failure it revokes what it made, so nothing is left behind.
func (is *Issuer) Issue() error {
	if err := is.Check(); err != nil {
		return err
	}
	if !is.Mode.Any() {
		return nil
	}
	if err := is.Revoke(); err != nil {
		return err
	}
	if err := is.issue(); err != nil {
		err = refusal(err)
		if rerr := is.Revoke(); rerr != nil {
			return fmt.Errorf("%w (and removing what was made: %v)", err, rerr)
		}
		return err
	}
	return nil
}

// preflight asks each cluster for what only its ACL administrators may
// read, so that a token that cannot issue credentials is told so before
// anything is made.
func (is *Issuer) preflight() error {
	if is.Mode.Nomad {
		if _, err := is.Nomad.ACLTokens(); err != nil {
			return refusal(err)
		}
	}
	if is.Mode.Consul {
		if err := is.Consul.CanAdminister(); err != nil {
			return refusal(err)
		}
	}
	return nil
}

func (is *Issuer) issue() error {
	items := api.VariableItems{itemOwner: is.owner()}
	if is.RecordDigest != "" {
		items[itemRecordDigest] = is.RecordDigest
	}
	desc := fmt.Sprintf("gpujob: the controller of sweep %s in namespace %s", is.Sweep, is.Namespace)
	if is.Mode.Nomad {
		if err := is.Nomad.UpsertACLPolicy(&api.ACLPolicy{Name: is.policy(), Description: desc,
			Rules: NomadRules(is.Namespace)}); err != nil {
			return err
		}
		tok, err := is.Nomad.CreateACLToken(&api.ACLToken{Name: is.tokenName(), Type: "client", Policies: []string{is.policy()}})
		if err != nil {
			return err
		}
		items[itemNomadToken], items[itemNomadAccessor] = tok.SecretID, tok.AccessorID
	}
	if is.Mode.Consul {
		id, err := is.Consul.UpsertPolicy(is.policy(), desc, ConsulRules(is.KeyPrefix, is.Namespace, is.Sweep))
		if err != nil {
			return err
		}
		accessor, secret, err := is.Consul.CreateToken(is.tokenName(), id)
		if err != nil {
			return err
		}
		items[itemConsulToken], items[itemConsulAccessor] = secret, accessor
	}
	for k, v := range map[string][]byte{itemConsulCA: is.ConsulTLS.CA, itemConsulCert: is.ConsulTLS.Cert, itemConsulKey: is.ConsulTLS.Key} {
		if len(v) > 0 {
			items[k] = string(v)
		}
	}
	return is.Nomad.PutVariable(&api.Variable{Namespace: is.Namespace, Path: VariablePath(is.JobID), Items: items})
}

// Ensure keeps the credentials a sweep has (its variable names tokens
// that still exist, and the digest of the record as submitted) and issues
// them otherwise, with RecordDigest: extend re-registers a controller that
// may still be running with them. Kept credentials keep the digest submit
// recorded: extend never vouches for a record that may have changed since.
// Issued ones take RecordDigest, the record as it is now (a sweep whose
// variable was lost, or one submitted before gpujob recorded digests).
func (is *Issuer) Ensure() error {
	if err := is.Check(); err != nil {
		return err
	}
	if !is.Mode.Any() {
		return nil
	}
	v, err := is.Nomad.Variable(VariablePath(is.JobID))
	if err != nil {
		return err
	}
	if v != nil && v.Items[itemOwner] == is.owner() && (!is.Mode.Consul || v.Items[itemConsulToken] != "") && v.Items[itemRecordDigest] != "" {
		toks, err := is.Nomad.ACLTokens()
		if err != nil {
			return refusal(err)
		}
		for _, t := range toks {
			if t.AccessorID == v.Items[itemNomadAccessor] && t.Name == is.tokenName() {
				return nil
			}
		}
	}
	return is.Issue()
}

// Revoke deletes the controller's tokens, policies and variable, whatever
// of them exists: the tokens the variable names, and any other token of the
// policy (a variable lost between two steps). It stops at the first
// failure; run again, it goes on where that one stopped.
func (is *Issuer) Revoke() error {
	if err := is.revoke(); err != nil {
		return fmt.Errorf("removing the credentials of sweep %s's controller: %w", is.Sweep, refusal(err))
	}
	return nil
}

func (is *Issuer) revoke() error {
	path := VariablePath(is.JobID)
	v, err := is.Nomad.Variable(path)
	if err != nil {
		return err
	}
	if v != nil && v.Items[itemOwner] != is.owner() {
		return fmt.Errorf("the Nomad variable %s is not sweep %s's (its %s item is %q): remove it by hand if it is a leftover",
			path, is.owner(), itemOwner, v.Items[itemOwner])
	}
	// The tokens are found by their name and policy, never by the
	// accessors the variable holds: whoever may write the variable must
	// not be able to point a purge at another token.
	if is.Mode.Nomad {
		toks, err := is.Nomad.ACLTokens()
		if err != nil {
			return err
		}
		for _, t := range toks {
			if t.Name == is.tokenName() && len(t.Policies) == 1 && t.Policies[0] == is.policy() {
				if err := is.Nomad.DeleteACLToken(t.AccessorID); err != nil {
					return err
				}
			}
		}
		if err := is.Nomad.DeleteACLPolicy(is.policy()); err != nil {
			return err
		}
	}
	if is.Mode.Consul {
		if err := is.Consul.DeletePolicyAndTokens(is.policy()); err != nil {
			return err
		}
	}
	if v != nil {
		return is.Nomad.DeleteVariable(path)
	}
	return nil
}

// refusal turns a refused ACL request into what to do: the controller's
// credentials are made and removed with the submitter's tokens, which must
// be able to administer ACLs.
func refusal(err error) error {
	var pe *nomadapi.PermissionError
	if errors.As(err, &pe) && pe.Problem == nomadapi.TokenDenied {
		who := "NOMAD_TOKEN is not set"
		if pe.TokenSet {
			who = "NOMAD_TOKEN is a token"
			if pe.TokenName != "" {
				who += fmt.Sprintf(" %q", pe.TokenName)
			}
			if len(pe.TokenPolicies) > 0 {
				who += " of policies " + strings.Join(pe.TokenPolicies, ", ")
			}
		}
		return fmt.Errorf("on a cluster with ACLs a sweep's controller gets a Nomad token and policy of its own, "+
			"and Nomad 1.6 lets only a management token create or delete them (%s; Nomad at %s refused %s): "+
			"submit and purge sweeps with a management token",
			who, pe.Address, pe.Op)
	}
	var ce *ConsulRefusal
	if errors.As(err, &ce) {
		return fmt.Errorf("on a cluster with ACLs a sweep's controller gets a Consul token and policy of its own, "+
			"which takes a Consul token with acl = \"write\" (Consul refused %s: %s): "+
			"submit and purge sweeps with CONSUL_HTTP_TOKEN set to one", ce.Op, ce.Err)
	}
	return err
}

// Credentials are what the controller acts with.
type Credentials struct {
	NomadToken, ConsulToken string
	ConsulTLS               TLS
	// RecordDigest is the digest of the sweep's record as it was
	// submitted; "" if the variable has none.
	RecordDigest string
}

// Fetch reads the controller's credentials from its variable at path,
// through nomad, a client whose token is the task's workload identity.
func Fetch(nomad nomadapi.API, path string) (*Credentials, error) {
	v, err := nomad.Variable(path)
	if err != nil {
		return nil, fmt.Errorf("reading the controller's credentials (variable %s): %w", path, err)
	}
	if v == nil {
		return nil, fmt.Errorf("the controller's credentials are gone (no variable %s): the sweep was purged, "+
			"or submitted by hand; gpujob sweep extend issues them again", path)
	}
	return &Credentials{
		NomadToken: v.Items[itemNomadToken], ConsulToken: v.Items[itemConsulToken],
		ConsulTLS:    TLS{CA: bytesOf(v.Items[itemConsulCA]), Cert: bytesOf(v.Items[itemConsulCert]), Key: bytesOf(v.Items[itemConsulKey])},
		RecordDigest: v.Items[itemRecordDigest],
	}, nil
}

func bytesOf(s string) []byte {
	if s == "" {
		return nil
	}
	return []byte(s)
}
