package nomadapi

import (
	"errors"
	"net/http"
	"strings"

	"github.com/hashicorp/nomad/api"
)

// management is what the ACL endpoints need of a token in Nomad 1.6.
var management = Need{Management: true}

// nomadACLDisabled is the body of Nomad's answer to an ACL request on a
// cluster without ACLs.
const nomadACLDisabled = "ACL support disabled"

func (c *client) ACLEnabled() (bool, error) {
	_, _, err := c.c.ACLTokens().Self(nil)
	var ue api.UnexpectedResponseError
	if errors.As(err, &ue) && ue.HasStatusCode() && strings.Contains(ue.Body(), nomadACLDisabled) {
		return false, nil
	}
	if err != nil {
		return true, c.explain("reading the ACL token", Need{Namespace: c.namespace, Capability: CapReadJob}, err)
	}
	return true, nil
}

func (c *client) UpsertACLPolicy(p *api.ACLPolicy) error {
	_, err := c.c.ACLPolicies().Upsert(p, nil)
	return c.explain("writing ACL policy "+p.Name, management, err)
}

func (c *client) DeleteACLPolicy(name string) error {
	_, err := c.c.ACLPolicies().Delete(name, nil)
	if isNotFound(err) {
		return nil
	}
	return c.explain("deleting ACL policy "+name, management, err)
}

func (c *client) CreateACLToken(t *api.ACLToken) (*api.ACLToken, error) {
	out, _, err := c.c.ACLTokens().Create(t, nil)
	return out, c.explain("creating ACL token "+t.Name, management, err)
}

func (c *client) ACLTokens() ([]*api.ACLTokenListStub, error) {
	out, _, err := c.c.ACLTokens().List(nil)
	return out, c.explain("listing ACL tokens", management, err)
}

func (c *client) DeleteACLToken(accessorID string) error {
	_, err := c.c.ACLTokens().Delete(accessorID, nil)
	// Nomad 1.6 answers a token that is gone with a 400.
	if isNotFound(err) || (err != nil && strings.Contains(err.Error(), "Cannot delete nonexistent tokens")) {
		return nil
	}
	return c.explain("deleting ACL token "+accessorID, management, err)
}

func (c *client) PutVariable(v *api.Variable) error {
	_, _, err := c.c.Variables().Update(v, &api.WriteOptions{Namespace: c.namespace})
	return c.explain("writing variable "+v.Path, Need{Namespace: c.namespace, Capability: "variables write on " + v.Path}, err)
}

func (c *client) Variable(path string) (*api.Variable, error) {
	v, _, err := c.c.Variables().Read(path, &api.QueryOptions{Namespace: c.namespace})
	if errors.Is(err, api.ErrVariablePathNotFound) || isNotFound(err) {
		return nil, nil
	}
	return v, c.explain("reading variable "+path, Need{Namespace: c.namespace, Capability: "variables read on " + path}, err)
}

func (c *client) DeleteVariable(path string) error {
	_, err := c.c.Variables().Delete(path, &api.WriteOptions{Namespace: c.namespace})
	if isNotFound(err) {
		return nil
	}
	return c.explain("deleting variable "+path, Need{Namespace: c.namespace, Capability: "variables destroy on " + path}, err)
}

// isNotFound is Nomad's 404.
func isNotFound(err error) bool {
	var ue api.UnexpectedResponseError
	return errors.As(err, &ue) && ue.HasStatusCode() && ue.StatusCode() == http.StatusNotFound
}
