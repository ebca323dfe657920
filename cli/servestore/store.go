// Package servestore reads and writes gpujob services' records in Consul KV
// (the layout is internal/servekv's) for the CLI: routes and bearer tokens.
package servestore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/internal/servekv"
)

// EnvKeyPrefix overrides where services live in Consul KV; it must match
// the gateways' --key-prefix.
const EnvKeyPrefix = "GPUJOB_SERVICE_KEY_PREFIX"

// Store is the services' tree at Prefix.
type Store struct {
	Consul *consul.Client
	Prefix string
	// Addr names Consul in errors (CONSUL_HTTP_ADDR); optional.
	Addr string
}

// KeyPrefix is where services live in Consul KV: $GPUJOB_SERVICE_KEY_PREFIX,
// else servekv.DefaultPrefix.
func KeyPrefix() string {
	if p := os.Getenv(EnvKeyPrefix); p != "" {
		return strings.TrimSuffix(p, "/")
	}
	return servekv.DefaultPrefix
}

// Open is the services' records in the factory's Consul, at KeyPrefix.
func Open(f *factory.Factory) (Store, error) {
	c, err := f.Consul()
	if err != nil {
		return Store{}, fmt.Errorf("services' records: %w", err)
	}
	s := New(c, KeyPrefix())
	s.Addr = os.Getenv("CONSUL_HTTP_ADDR")
	if s.Addr == "" {
		s.Addr = "127.0.0.1:8500"
	}
	return s, nil
}

// New is a Store at prefix ("" is servekv.DefaultPrefix).
func New(c *consul.Client, prefix string) Store {
	if prefix == "" {
		prefix = servekv.DefaultPrefix
	}
	return Store{Consul: c, Prefix: strings.TrimSuffix(prefix, "/")}
}

func (s Store) addr() string {
	if s.Addr == "" {
		return "CONSUL_HTTP_ADDR"
	}
	return s.Addr
}

func (s Store) wrap(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s in Consul at %s: %w", what, s.addr(), err)
}

// PutRoute writes (or replaces) the service's route.
func (s Store) PutRoute(ctx context.Context, r servekv.Route) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	key := servekv.RouteKey(s.Prefix, r.Namespace, r.Service)
	_, err = s.Consul.KV().Put(&consul.KVPair{Key: key, Value: b}, (&consul.WriteOptions{}).WithContext(ctx))
	return s.wrap("writing the route "+key, err)
}

// Route reads the service's route; nil when it has none.
func (s Store) Route(ctx context.Context, ns, svc string) (*servekv.Route, error) {
	key := servekv.RouteKey(s.Prefix, ns, svc)
	p, _, err := s.Consul.KV().Get(key, (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, s.wrap("reading the route "+key, err)
	}
	if p == nil {
		return nil, nil
	}
	var r servekv.Route
	if err := json.Unmarshal(p.Value, &r); err != nil {
		return nil, fmt.Errorf("the route %s in Consul is not a route: %w", key, err)
	}
	return &r, nil
}

// Routes lists every service's route, of every namespace.
func (s Store) Routes(ctx context.Context) ([]servekv.Route, error) {
	pairs, _, err := s.Consul.KV().List(s.Prefix+"/", (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, s.wrap("listing the routes under "+s.Prefix+"/", err)
	}
	var out []servekv.Route
	for _, p := range pairs {
		ns, svc, ok := servekv.ParseRouteKey(s.Prefix, p.Key)
		if !ok {
			continue
		}
		var r servekv.Route
		if json.Unmarshal(p.Value, &r) != nil {
			continue
		}
		r.Namespace, r.Service = ns, svc
		out = append(out, r)
	}
	return out, nil
}

// DeleteRoute removes the route (the gateways stop routing to the service)
// and keeps its tokens.
func (s Store) DeleteRoute(ctx context.Context, ns, svc string) error {
	key := servekv.RouteKey(s.Prefix, ns, svc)
	_, err := s.Consul.KV().Delete(key, (&consul.WriteOptions{}).WithContext(ctx))
	return s.wrap("deleting the route "+key, err)
}

// DeleteService removes every record of the service, tokens included.
func (s Store) DeleteService(ctx context.Context, ns, svc string) error {
	key := servekv.ServiceKey(s.Prefix, ns, svc) + "/"
	_, err := s.Consul.KV().DeleteTree(key, (&consul.WriteOptions{}).WithContext(ctx))
	return s.wrap("deleting "+key, err)
}

// CreateToken makes a token for the service and returns its secret, which
// is stored nowhere: only its hash is.
func (s Store) CreateToken(ctx context.Context, ns, svc, name string, limit *servekv.Limit, now time.Time) (string, servekv.Token, error) {
	secret, hash, id, err := servekv.NewSecret()
	if err != nil {
		return "", servekv.Token{}, err
	}
	t := servekv.Token{ID: id, Name: name, Limit: limit, Created: now.UTC().Truncate(time.Second)}
	b, err := json.Marshal(t)
	if err != nil {
		return "", servekv.Token{}, err
	}
	key := servekv.TokenKey(s.Prefix, ns, svc, hash)
	// Create-only: a collision of 256-bit secrets would be a broken RNG.
	ok, _, err := s.Consul.KV().CAS(&consul.KVPair{Key: key, Value: b, ModifyIndex: 0}, (&consul.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return "", servekv.Token{}, s.wrap("storing the token", err)
	}
	if !ok {
		return "", servekv.Token{}, fmt.Errorf("storing the token: its key %s exists already", key)
	}
	return secret, t, nil
}

// StoredToken is a token and the hash it is stored under.
type StoredToken struct {
	servekv.Token
	Hash string `json:"-"`
}

// Tokens lists the service's tokens, oldest first.
func (s Store) Tokens(ctx context.Context, ns, svc string) ([]StoredToken, error) {
	prefix := servekv.TokensPrefix(s.Prefix, ns, svc)
	pairs, _, err := s.Consul.KV().List(prefix, (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, s.wrap("listing the tokens "+prefix, err)
	}
	var out []StoredToken
	for _, p := range pairs {
		_, _, hash, ok := servekv.ParseTokenKey(s.Prefix, p.Key)
		if !ok {
			continue
		}
		var t servekv.Token
		if err := json.Unmarshal(p.Value, &t); err != nil {
			continue // not ours to judge; the gateway skips it too
		}
		out = append(out, StoredToken{Token: t, Hash: hash})
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.Before(out[j].Created)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// ErrNoToken is RevokeToken's answer when no token has the ID.
var ErrNoToken = errors.New("no such token")

// RevokeToken deletes the token whose ID is id (or starts with it, when
// that is one token and at least 6 digits).
func (s Store) RevokeToken(ctx context.Context, ns, svc, id string) (StoredToken, error) {
	toks, err := s.Tokens(ctx, ns, svc)
	if err != nil {
		return StoredToken{}, err
	}
	var match []StoredToken
	for _, t := range toks {
		if t.ID == id || len(id) >= 6 && strings.HasPrefix(t.ID, id) {
			match = append(match, t)
		}
	}
	switch len(match) {
	case 0:
		return StoredToken{}, fmt.Errorf("service %s/%s has no token %q: %w (gpujob token list --service %s)", ns, svc, id, ErrNoToken, svc)
	case 1:
	default:
		return StoredToken{}, fmt.Errorf("%q is the start of %d tokens' IDs; give more of it", id, len(match))
	}
	key := servekv.TokenKey(s.Prefix, ns, svc, match[0].Hash)
	if _, err := s.Consul.KV().Delete(key, (&consul.WriteOptions{}).WithContext(ctx)); err != nil {
		return StoredToken{}, s.wrap("deleting the token", err)
	}
	return match[0], nil
}
