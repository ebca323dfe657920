package supervisor

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	consul "github.com/hashicorp/consul/api"
)

// TokenRejectedError is Consul refusing the token the supervisors would use:
// one it does not know (mistyped, deleted, expired and reaped, or of another
// cluster). Unlike an unreachable Consul it does not pass by itself, and
// every rendezvous would fail on it, so the driver reports it at once.
type TokenRejectedError struct {
	Address string
	Reason  string // Consul's words, e.g. "ACL not found"
}

func (e *TokenRejectedError) Error() string {
	return fmt.Sprintf("consul at %s rejects the driver's token (%s): set the plugin's consul { token } "+
		"(or CONSUL_HTTP_TOKEN of the Nomad client) to a token with the policy of jobspecs/acl/consul-gpujob-driver.hcl",
		e.Address, e.Reason)
}

// checkToken asks Consul about its own token (any valid token may read
// itself), so a bad token shows in the driver's health rather than in every
// task's failed rendezvous. Without ACLs Consul answers 401 "ACL support
// disabled", which is fine; other failures are Consul being unreachable.
// The token is never part of an error.
func checkToken(ctx context.Context, client *consul.Client, s ConsulSpec) error {
	if s.Token == "" {
		return nil
	}
	q := (&consul.QueryOptions{}).WithContext(ctx)
	_, _, err := client.ACL().TokenReadSelf(q)
	if err == nil {
		return nil
	}
	var se consul.StatusError
	if errors.As(err, &se) {
		body := strings.TrimSpace(se.Body)
		switch {
		case se.Code == http.StatusUnauthorized && strings.Contains(body, "ACL support disabled"):
			return nil
		case se.Code == http.StatusForbidden:
			return &TokenRejectedError{Address: s.Address, Reason: body}
		}
	}
	return fmt.Errorf("consul at %s: reading the driver's own token: %w", s.Address, err)
}
