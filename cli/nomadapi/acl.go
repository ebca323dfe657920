package nomadapi

import (
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"
)

// Need is one ACL rule a request needs: a capability in a namespace, or a
// node policy.
type Need struct {
	Namespace  string // with Capability
	Capability string // a namespace capability, e.g. "submit-job"
	Node       string // a node policy ("read"), when Capability is empty
	// Management: only a management token may do it (ACL tokens and
	// policies, in Nomad 1.6).
	Management bool
}

// Namespace capabilities the CLI's requests need (Nomad's acl package).
const (
	CapSubmitJob = "submit-job"
	CapReadJob   = "read-job"
	CapListJobs  = "list-jobs"
	CapReadLogs  = "read-logs"
	CapScaleJob  = "scale-job"
)

func (n Need) String() string {
	if n.Management {
		return "a management token"
	}
	if n.Capability == "" {
		return "node " + n.Node
	}
	return fmt.Sprintf("the %s capability in namespace %q", n.Capability, n.Namespace)
}

// TokenProblem says what Nomad made of the request's token.
type TokenProblem int

const (
	// TokenDenied: Nomad knows the token (or used the anonymous policy, for
	// none) and its policies lack what the request needs.
	TokenDenied TokenProblem = iota
	// TokenNotFound: no token has this secret (mistyped, revoked, forged, or
	// of another cluster).
	TokenNotFound
	// TokenExpired: the token had an expiration time and it has passed.
	TokenExpired
)

// PermissionError is Nomad refusing a request on ACL grounds, with what the
// request needed; the command's own needs are added by ForCommand.
type PermissionError struct {
	Op      string // what the CLI was doing, e.g. "planning the job"
	Need    Need
	Address string
	// TokenSet is whether the request carried a token (else Nomad applied
	// its anonymous policy).
	TokenSet bool
	Problem  TokenProblem
	// TokenName and TokenPolicies describe a token Nomad knows (never its
	// secret), when the CLI could read them.
	TokenName     string
	TokenPolicies []string
	// Expired is when the token expired (TokenExpired), if known.
	Expired time.Time
	// Command and CommandNeeds, when set, are the gpujob command that failed
	// and everything it needs, so one error tells the whole policy.
	Command      string
	CommandNeeds []Need
	Err          error
}

func (e *PermissionError) Unwrap() error { return e.Err }

func (e *PermissionError) Error() string {
	var b strings.Builder
	switch e.Problem {
	case TokenNotFound:
		fmt.Fprintf(&b, "permission denied: Nomad at %s does not know the ACL token (ACL token not found) while %s: "+
			"it is mistyped, revoked or from another cluster; set NOMAD_TOKEN (or --token) to a valid token", e.Address, e.Op)
		return b.String()
	case TokenExpired:
		when := ""
		if !e.Expired.IsZero() {
			when = " at " + e.Expired.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(&b, "permission denied: the ACL token%s expired%s (Nomad at %s refused %s); "+
			"set NOMAD_TOKEN (or --token) to a new token", e.tokenLabel(), when, e.Address, e.Op)
		return b.String()
	}
	fmt.Fprintf(&b, "permission denied: this needs %s (Nomad at %s refused %s", e.Need, e.Address, e.Op)
	switch {
	case !e.TokenSet:
		b.WriteString(" to the anonymous token: NOMAD_TOKEN is not set")
	case e.TokenName != "" || len(e.TokenPolicies) > 0:
		fmt.Fprintf(&b, " to the token%s", e.tokenLabel())
	}
	b.WriteString(")")
	grant := "it"
	if e.Command != "" && len(e.CommandNeeds) > 0 && !(len(e.CommandNeeds) == 1 && e.CommandNeeds[0] == e.Need) {
		fmt.Fprintf(&b, "; gpujob %s needs %s", e.Command, describeNeeds(e.CommandNeeds))
		grant = "them"
	}
	fmt.Fprintf(&b, "; set NOMAD_TOKEN to a token whose policy grants %s", grant)
	return b.String()
}

// tokenLabel is ` "name" (policies a, b)` for a token whose name or
// policies are known, else "".
func (e *PermissionError) tokenLabel() string {
	var b strings.Builder
	if e.TokenName != "" {
		fmt.Fprintf(&b, " %q", e.TokenName)
	}
	if len(e.TokenPolicies) > 0 {
		fmt.Fprintf(&b, " (policies %s)", strings.Join(e.TokenPolicies, ", "))
	}
	return b.String()
}

// describeNeeds lists needs in plain words: the namespace capabilities
// together, then the node policy.
func describeNeeds(needs []Need) string {
	byNS := map[string][]string{}
	var namespaces []string
	var node []string
	for _, n := range needs {
		if n.Management || n.Capability == "" {
			node = append(node, n.String())
			continue
		}
		if _, ok := byNS[n.Namespace]; !ok {
			namespaces = append(namespaces, n.Namespace)
		}
		byNS[n.Namespace] = append(byNS[n.Namespace], n.Capability)
	}
	sort.Strings(namespaces)
	var parts []string
	for _, ns := range namespaces {
		caps := byNS[ns]
		word := "capability"
		if len(caps) > 1 {
			word = "capabilities"
		}
		parts = append(parts, fmt.Sprintf("the %s %s in namespace %q", andList(caps), word, ns))
	}
	parts = append(parts, node...)
	return andList(parts)
}

func andList(xs []string) string {
	switch len(xs) {
	case 0:
		return ""
	case 1:
		return xs[0]
	}
	return strings.Join(xs[:len(xs)-1], ", ") + " and " + xs[len(xs)-1]
}

// commandNeeds is what each command asks of Nomad, in the namespace it
// works in; jobspecs/acl/nomad-submit.hcl and nomad-readonly.hcl grant it.
// Commands that do not talk to Nomad (render, validate) are absent.
var commandNeeds = map[string]struct {
	caps []string
	node bool
}{
	"submit": {caps: []string{CapSubmitJob, CapReadJob, CapReadLogs}, node: true},
	"stop":   {caps: []string{CapSubmitJob, CapReadJob}},
	"status": {caps: []string{CapReadJob, CapReadLogs}},
	"logs":   {caps: []string{CapReadJob, CapReadLogs}},
	"list":   {caps: []string{CapListJobs}},
	"gpus":   {caps: []string{CapReadJob}, node: true},
}

// CommandNeeds is every ACL rule the gpujob command needs in namespace.
func CommandNeeds(command, namespace string) []Need {
	c, ok := commandNeeds[command]
	if !ok {
		return nil
	}
	var out []Need
	for _, cp := range c.caps {
		out = append(out, Need{Namespace: namespace, Capability: cp})
	}
	if c.node {
		out = append(out, Need{Node: "read"})
	}
	return out
}

// ForCommand adds to a PermissionError in err what command needs as a whole,
// so the message names the full policy rather than only the first refused
// request's rule. Other errors pass unchanged.
func ForCommand(command string, err error) error {
	var pe *PermissionError
	if err == nil || !errors.As(err, &pe) || pe.Command != "" {
		return err
	}
	ns := pe.Need.Namespace
	if ns == "" {
		ns = "default"
	}
	pe.Command, pe.CommandNeeds = command, CommandNeeds(command, ns)
	return err
}

// Nomad's error texts for a token it could not use (nomad/structs/errors.go:
// ErrTokenNotFound, ErrTokenExpired, ErrPermissionDenied). Nomad's HTTP
// layer classifies errors by the same suffixes; an expired token comes back
// as a 500 ("failed to resolve ACL token: ACL token expired"), the others
// as 403.
const (
	nomadTokenNotFound = "ACL token not found"
	nomadTokenExpired  = "ACL token expired"
)

// TokenInfo is what Nomad says of the request's own token
// (/v1/acl/token/self): the token, or the error it answered with.
type TokenInfo func() (*api.ACLToken, error)

// diagnose tells a refusal to a known token apart from a token Nomad does not
// know or that has expired. Nomad answers all three alike ("Permission
// denied") on most endpoints, but a token can always read itself: a 404
// there is a token Nomad does not know, an expiration time in the past one
// that has expired. Only called for a refusal of a request with a token.
func (pe *PermissionError) diagnose(self TokenInfo, now time.Time) {
	tok, err := self()
	if err != nil {
		var ue api.UnexpectedResponseError
		if errors.As(err, &ue) {
			body := strings.TrimSpace(ue.Body())
			switch {
			case ue.StatusCode() == http.StatusNotFound || strings.HasSuffix(body, nomadTokenNotFound):
				pe.Problem = TokenNotFound
			case strings.HasSuffix(body, nomadTokenExpired):
				pe.Problem = TokenExpired
			}
		}
		return
	}
	if tok == nil {
		return
	}
	pe.TokenName, pe.TokenPolicies = tok.Name, tok.Policies
	if tok.ExpirationTime != nil && !tok.ExpirationTime.IsZero() && !tok.ExpirationTime.After(now) {
		pe.Problem, pe.Expired = TokenExpired, *tok.ExpirationTime
	}
}

// permissionError returns a *PermissionError when err is Nomad refusing a
// request on ACL grounds, else nil.
func permissionError(op string, need Need, addr string, tokenSet bool, err error) *PermissionError {
	var ue api.UnexpectedResponseError
	if !errors.As(err, &ue) || !ue.HasStatusCode() {
		return nil
	}
	body := strings.TrimSpace(ue.Body())
	pe := &PermissionError{Op: op, Need: need, Address: addr, TokenSet: tokenSet, Err: err}
	switch {
	case strings.HasSuffix(body, nomadTokenExpired):
		pe.Problem = TokenExpired
	case ue.StatusCode() != http.StatusForbidden:
		return nil
	case strings.HasSuffix(body, nomadTokenNotFound):
		pe.Problem = TokenNotFound
	default:
		pe.Problem = TokenDenied
	}
	return pe
}
