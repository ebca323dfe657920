package nomadapi

import (
	"fmt"
	"sort"

	"github.com/hashicorp/nomad/api"
)

// SetACLEnabled makes the fake a cluster with ACLs (ACLEnabled answers
// true). The fake checks no token: a test makes a call fail with Fail.
func (f *Fake) SetACLEnabled(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.aclEnabled = on
}

// ACLPolicies, Tokens and Variables are the fake's ACL policies (by name),
// tokens (by accessor) and variables (by path), for assertions.
func (f *Fake) ACLPolicies() map[string]*api.ACLPolicy { return cloneAll(f, f.policies) }
func (f *Fake) Tokens() map[string]*api.ACLToken       { return cloneAll(f, f.tokens) }
func (f *Fake) Variables() map[string]*api.Variable    { return cloneAll(f, f.vars) }

// cloneAll deep-copies one of the fake's maps under its lock.
func cloneAll[T any](f *Fake, m map[string]*T) map[string]*T {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]*T, len(m))
	for k, v := range m {
		out[k] = clone(v)
	}
	return out
}

func (f *Fake) ACLEnabled() (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.errLocked("ACLEnabled"); err != nil {
		return true, err
	}
	return f.aclEnabled, nil
}

func (f *Fake) UpsertACLPolicy(p *api.ACLPolicy) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.errLocked("UpsertACLPolicy"); err != nil {
		return err
	}
	f.policies[p.Name] = clone(p)
	f.bumpLocked()
	return nil
}

func (f *Fake) DeleteACLPolicy(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.errLocked("DeleteACLPolicy"); err != nil {
		return err
	}
	delete(f.policies, name)
	f.bumpLocked()
	return nil
}

func (f *Fake) CreateACLToken(t *api.ACLToken) (*api.ACLToken, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.errLocked("CreateACLToken"); err != nil {
		return nil, err
	}
	for _, p := range t.Policies {
		if _, ok := f.policies[p]; !ok {
			return nil, fmt.Errorf("creating ACL token %s: Unexpected response code: 500 (policy lookup for %q failed: not found)", t.Name, p)
		}
	}
	f.tokenNo++
	out := clone(t)
	out.AccessorID = fmt.Sprintf("00000000-0000-0000-0000-%012d", f.tokenNo)
	out.SecretID = fmt.Sprintf("11111111-0000-0000-0000-%012d", f.tokenNo)
	f.tokens[out.AccessorID] = out
	f.bumpLocked()
	return clone(out), nil
}

func (f *Fake) ACLTokens() ([]*api.ACLTokenListStub, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.errLocked("ACLTokens"); err != nil {
		return nil, err
	}
	var out []*api.ACLTokenListStub
	for _, t := range f.tokens {
		out = append(out, &api.ACLTokenListStub{AccessorID: t.AccessorID, Name: t.Name, Type: t.Type,
			Policies: append([]string(nil), t.Policies...)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].AccessorID < out[j].AccessorID })
	return out, nil
}

func (f *Fake) DeleteACLToken(accessorID string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.errLocked("DeleteACLToken"); err != nil {
		return err
	}
	delete(f.tokens, accessorID)
	f.bumpLocked()
	return nil
}

func (f *Fake) PutVariable(v *api.Variable) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.errLocked("PutVariable"); err != nil {
		return err
	}
	f.vars[v.Path] = clone(v)
	f.bumpLocked()
	return nil
}

func (f *Fake) Variable(path string) (*api.Variable, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.errLocked("Variable"); err != nil {
		return nil, err
	}
	return clone(f.vars[path]), nil
}

func (f *Fake) DeleteVariable(path string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.errLocked("DeleteVariable"); err != nil {
		return err
	}
	delete(f.vars, path)
	f.bumpLocked()
	return nil
}
