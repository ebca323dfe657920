package gateway

import (
	"net/http"
	"strings"

	"github.com/gpujob/gpujob/internal/servekv"
)

// bearer is a request's authenticated token.
type bearer struct {
	hash  string
	token servekv.Token
}

// authenticate checks the bearer token of a request to a route with Auth
// against that service's tokens, answering 401 itself when it fails; a
// route without Auth lets every request through with no token. The secret
// is only hashed, never kept or logged; proxy strips it from the request.
func (g *Gateway) authenticate(w http.ResponseWriter, r *http.Request, e *routeEntry) (*bearer, bool) {
	if !e.route.Auth {
		return nil, true
	}
	secret, ok := bearerSecret(r.Header.Get("Authorization"))
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="gpujob"`)
		writeError(w, http.StatusUnauthorized, "missing bearer token")
		return nil, false
	}
	hash := servekv.HashSecret(secret)
	// A map lookup by the hash: the secrets are random, so what a timing
	// difference could tell about a hash's prefix helps find no secret.
	t, found := e.tokens[hash]
	if !found {
		w.Header().Set("WWW-Authenticate", `Bearer realm="gpujob", error="invalid_token"`)
		writeError(w, http.StatusUnauthorized, "invalid token")
		return nil, false
	}
	return &bearer{hash: hash, token: t}, true
}

// bearerSecret is the secret of an "Authorization: Bearer <secret>" header
// (the scheme is case-insensitive, RFC 9110 §11.1).
func bearerSecret(h string) (string, bool) {
	scheme, secret, found := strings.Cut(strings.TrimSpace(h), " ")
	if !found || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	secret = strings.TrimSpace(secret)
	return secret, secret != ""
}
