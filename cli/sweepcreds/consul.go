package sweepcreds

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	consul "github.com/hashicorp/consul/api"
)

// Consul is what the issuer needs of Consul's ACL system.
type Consul interface {
	// ACLEnabled asks with the client's own token; Consul answers "ACL
	// support disabled" where there are none.
	ACLEnabled() (bool, error)
	// UpsertPolicy creates or updates the policy of that name; its ID.
	UpsertPolicy(name, description, rules string) (string, error)
	// CreateToken makes a token of the one policy; its accessor and secret.
	CreateToken(description, policyID string) (accessor, secret string, err error)
	// DeletePolicyAndTokens deletes every token of the named policy, then
	// the policy; none is not an error.
	DeletePolicyAndTokens(name string) error
	// CanAdminister fails with a *ConsulRefusal when the client's token
	// may not read ACL policies (a token that may write them may).
	CanAdminister() error
}

// ConsulRefusal is Consul refusing an ACL request to the client's token.
type ConsulRefusal struct {
	Op  string
	Err error
}

func (e *ConsulRefusal) Error() string { return e.Op + ": " + e.Err.Error() }
func (e *ConsulRefusal) Unwrap() error { return e.Err }

// wrap names the operation of err, as a *ConsulRefusal when Consul refused
// the token.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	var se consul.StatusError
	if errors.As(err, &se) && se.Code == http.StatusForbidden {
		return &ConsulRefusal{Op: op, Err: err}
	}
	return fmt.Errorf("%s in Consul: %w", op, err)
}

func (a consulACL) CanAdminister() error {
	_, _, err := a.c.ACL().PolicyList(nil)
	return wrap("listing ACL policies", err)
}

// NewConsul is Consul over the API client c.
func NewConsul(c *consul.Client) Consul { return consulACL{c} }

type consulACL struct{ c *consul.Client }

func (a consulACL) ACLEnabled() (bool, error) {
	_, _, err := a.c.ACL().TokenReadSelf(nil)
	var se consul.StatusError
	if errors.As(err, &se) && strings.Contains(se.Body, "ACL support disabled") {
		return false, nil
	}
	if err != nil {
		return true, fmt.Errorf("reading Consul's ACL token (CONSUL_HTTP_TOKEN): %w", err)
	}
	return true, nil
}

func (a consulACL) UpsertPolicy(name, description, rules string) (string, error) {
	old, _, err := a.c.ACL().PolicyReadByName(name, nil)
	if err != nil {
		return "", wrap("reading ACL policy "+name, err)
	}
	p := &consul.ACLPolicy{Name: name, Description: description, Rules: rules}
	if old != nil {
		p.ID = old.ID
		out, _, err := a.c.ACL().PolicyUpdate(p, nil)
		if err != nil {
			return "", wrap("updating ACL policy "+name, err)
		}
		return out.ID, nil
	}
	out, _, err := a.c.ACL().PolicyCreate(p, nil)
	if err != nil {
		return "", wrap("creating ACL policy "+name, err)
	}
	return out.ID, nil
}

func (a consulACL) CreateToken(description, policyID string) (string, string, error) {
	t, _, err := a.c.ACL().TokenCreate(&consul.ACLToken{Description: description,
		Policies: []*consul.ACLTokenPolicyLink{{ID: policyID}}}, nil)
	if err != nil {
		return "", "", wrap("creating an ACL token", err)
	}
	return t.AccessorID, t.SecretID, nil
}

func (a consulACL) deleteToken(accessor string) error {
	_, err := a.c.ACL().TokenDelete(accessor, nil)
	if consulNotFound(err) {
		return nil
	}
	return wrap("deleting ACL token "+accessor, err)
}

func (a consulACL) DeletePolicyAndTokens(name string) error {
	p, _, err := a.c.ACL().PolicyReadByName(name, nil)
	if err != nil {
		return wrap("reading ACL policy "+name, err)
	}
	if p == nil {
		return nil
	}
	toks, _, err := a.c.ACL().TokenListFiltered(consul.ACLTokenFilterOptions{Policy: p.ID}, nil)
	if err != nil {
		return wrap("listing the tokens of ACL policy "+name, err)
	}
	for _, t := range toks {
		if err := a.deleteToken(t.AccessorID); err != nil {
			return err
		}
	}
	if _, err := a.c.ACL().PolicyDelete(p.ID, nil); err != nil && !consulNotFound(err) {
		return wrap("deleting ACL policy "+name, err)
	}
	return nil
}

// consulNotFound is Consul's 404: Consul 1.15 answers the delete of a
// token or policy that is gone so ("Cannot find token to delete"). Consul
// answers an unknown request token with the same 404 there, which is why
// Check asks first with a read that fails on one (CanAdminister).
func consulNotFound(err error) bool {
	var se consul.StatusError
	return errors.As(err, &se) && se.Code == http.StatusNotFound
}
