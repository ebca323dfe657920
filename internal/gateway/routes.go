package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"reflect"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/consul"
	"github.com/gpujob/gpujob/internal/servekv"
)

// watchWait is how long one blocking query may wait for a change; Consul
// caps it at 10 minutes and adds up to 1/16 of jitter.
const watchWait = 5 * time.Minute

// service is one routed service's lasting state: it outlives route rewrites
// (so its counters and token limiters do) and ends when its route is
// deleted.
type service struct {
	ns, name string
	key      string // servekv.LoadName

	// pool is the current replica pool; replaced when the route's Consul
	// service, tag or job changes.
	pool atomic.Pointer[pool]
	// removed is set when the route is deleted, so that requests held for
	// it stop waiting.
	removed atomic.Bool

	inflight atomic.Int64 // requests being proxied
	queued   atomic.Int64 // requests held for want of a replica
	// window is the last minute of its requests, for /-/stats.
	window window

	// route is the last good route; only the routes watch touches it.
	route *servekv.Route
}

// routeEntry is one line of the routing table.
type routeEntry struct {
	route  *servekv.Route
	prefix string // PathPrefix without its trailing slashes; "" routes all
	host   string // lower case, without a port; "" = any
	svc    *service
	// tokens are the service's tokens by hash.
	tokens map[string]servekv.Token
	// created is the route key's CreateIndex: of two routes of one host
	// and prefix, the older wins (dropConflicts).
	created uint64
}

// table is an immutable routing table, longest prefix first.
type table struct {
	entries []*routeEntry
}

// match returns the route for a request's Host and path: the longest
// PathPrefix that matches segment-wise and whose Host, if any, is the
// request's.
func (t *table) match(host, path string) *routeEntry {
	host = normalizeHost(host)
	for _, e := range t.entries {
		if e.host != "" && e.host != host {
			continue
		}
		if prefixMatches(e.prefix, path) {
			return e
		}
	}
	return nil
}

// prefixMatches reports whether path is prefix or under it, segment-wise:
// /svc matches /svc, /svc/ and /svc/x, never /svcx.
func prefixMatches(prefix, path string) bool {
	if prefix == "" {
		return true
	}
	if !strings.HasPrefix(path, prefix) {
		return false
	}
	return len(path) == len(prefix) || path[len(prefix)] == '/'
}

// normalizePrefix drops trailing slashes, so "/svc/" routes as "/svc" and
// "/" routes everything.
func normalizePrefix(p string) string { return strings.TrimRight(p, "/") }

// normalizeHost lower-cases a Host and drops its port.
func normalizeHost(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	}
	return strings.ToLower(strings.TrimSuffix(h, "."))
}

// newTable orders entries so that match's first hit is the right one:
// longer prefixes first, then routes bound to a Host before routes for any,
// then by service for determinism.
func newTable(entries []*routeEntry) *table {
	sort.Slice(entries, func(i, j int) bool {
		a, b := entries[i], entries[j]
		if len(a.prefix) != len(b.prefix) {
			return len(a.prefix) > len(b.prefix)
		}
		if (a.host != "") != (b.host != "") {
			return a.host != ""
		}
		return a.svc.key < b.svc.key
	})
	return &table{entries: entries}
}

// watchRoutes keeps the routing table and the pools current with one
// blocking list of the services' tree, which holds both the routes and the
// tokens, until ctx ends. On errors it keeps the last good table.
func (g *Gateway) watchRoutes(ctx context.Context) {
	bad := map[string]uint64{} // malformed keys already logged, by ModifyIndex
	_ = consul.Watch(ctx, consul.PrefixQuery(g.cfg.Consul, g.prefix+"/"), watchOptions(g.logf, "gateway: watching routes under "+g.prefix+"/"),
		func(pairs consulapi.KVPairs, _ uint64) error {
			g.applyKV(ctx, pairs, bad)
			return nil
		})
}

// watchOptions pace the gateway's Consul watches; their failures are logged
// (throttled) as what, and the last good answer stays meanwhile.
func watchOptions(logf func(string, ...any), what string) consul.WatchOptions {
	return consul.WatchOptions{
		WaitTime: watchWait, BackoffBase: 250 * time.Millisecond, BackoffCap: 30 * time.Second,
		Logf: logf, What: what, Note: " (keeping the last good ones)",
	}
}

// applyKV rebuilds the routing table from a list of the services' tree and
// starts, replaces or stops the services' pools to match. A malformed value
// is logged (once per version) and skipped; a route that was good and turns
// malformed keeps its last good version, so that a bad write cannot take a
// live service down.
func (g *Gateway) applyKV(ctx context.Context, pairs consulapi.KVPairs, bad map[string]uint64) {
	routes := map[string]*servekv.Route{}
	created := map[string]uint64{} // the route key's CreateIndex, by service
	names := map[string][2]string{}
	tokens := map[string]map[string]servekv.Token{}
	seen := map[string]bool{}
	logBad := func(p *consulapi.KVPair, what string, err error) {
		seen[p.Key] = true
		if bad[p.Key] != p.ModifyIndex {
			bad[p.Key] = p.ModifyIndex
			g.logf("gateway: skipping %s at %s: %v", what, p.Key, err)
		}
	}
	for _, p := range pairs {
		if ns, svc, ok := servekv.ParseRouteKey(g.prefix, p.Key); ok {
			key := servekv.LoadName(ns, svc)
			names[key] = [2]string{ns, svc}
			created[key] = p.CreateIndex
			r, err := parseRoute(p.Value, ns, svc)
			if err != nil {
				logBad(p, "route", err)
				routes[key] = nil // present but bad: keep the last good one
				continue
			}
			routes[key] = r
			continue
		}
		if ns, svc, hash, ok := servekv.ParseTokenKey(g.prefix, p.Key); ok {
			var t servekv.Token
			if err := json.Unmarshal(p.Value, &t); err != nil {
				// Never the value in the log: it is a token record.
				logBad(p, "token", fmt.Errorf("malformed JSON"))
				continue
			}
			key := servekv.LoadName(ns, svc)
			if tokens[key] == nil {
				tokens[key] = map[string]servekv.Token{}
			}
			tokens[key][hash] = t
		}
	}
	for k := range bad {
		if !seen[k] {
			delete(bad, k)
		}
	}

	g.mu.Lock()
	defer g.mu.Unlock()
	var entries []*routeEntry
	for key, r := range routes {
		s := g.services[key]
		if r == nil {
			if s == nil || s.route == nil {
				continue // never had a good version
			}
			r = s.route
		}
		if s == nil {
			s = &service{ns: names[key][0], name: names[key][1], key: key}
			g.services[key] = s
			g.logf("gateway: route %s added: %s%s -> consul service %q tag %q", key, r.Host, r.PathPrefix, r.ConsulService, r.Tag)
		} else if !reflect.DeepEqual(s.route, r) {
			g.logf("gateway: route %s changed: %s%s -> consul service %q tag %q", key, r.Host, r.PathPrefix, r.ConsulService, r.Tag)
		}
		old := s.pool.Load()
		if old == nil || old.consulService != r.ConsulService || old.tag != r.Tag || old.jobID != r.JobID {
			// The new pool first, so that the requests held on the old
			// one, woken by its stop, find it.
			p := newPool(g, s, r.ConsulService, r.Tag, r.JobID)
			s.pool.Store(p)
			if old != nil {
				old.stop()
			}
			p.start(ctx)
		}
		s.route = r
		entries = append(entries, &routeEntry{
			route:   r,
			prefix:  normalizePrefix(r.PathPrefix),
			host:    normalizeHost(r.Host),
			svc:     s,
			tokens:  tokens[key],
			created: created[key],
		})
	}
	for key, s := range g.services {
		if _, ok := routes[key]; ok {
			continue
		}
		delete(g.services, key)
		s.removed.Store(true)
		if p := s.pool.Load(); p != nil {
			p.stop()
		}
		g.metrics.forget(s)
		g.logf("gateway: route %s removed", key)
	}
	entries, dropped := dropConflicts(entries)
	for _, d := range dropped {
		g.logf("gateway: route %s claims %s%s, which %s had first; not routing it (gpujob service deploy refuses this)",
			d.lost.svc.key, d.lost.route.Host, d.lost.route.PathPrefix, d.kept.svc.key)
	}
	g.table.Store(newTable(entries))
}

// conflict is a route left out because another one had its host and
// prefix first.
type conflict struct{ kept, lost *routeEntry }

// dropConflicts keeps, of the routes with the same host and prefix, the one
// whose key Consul created first: a service deployed later (another
// namespace's, say) can never take over a path that is routed already.
func dropConflicts(entries []*routeEntry) ([]*routeEntry, []conflict) {
	first := map[[2]string]*routeEntry{}
	for _, e := range entries {
		k := [2]string{e.host, e.prefix}
		if f, ok := first[k]; !ok || e.created < f.created || e.created == f.created && e.svc.key < f.svc.key {
			first[k] = e
		}
	}
	var kept []*routeEntry
	var lost []conflict
	for _, e := range entries {
		if f := first[[2]string{e.host, e.prefix}]; f != e {
			lost = append(lost, conflict{kept: f, lost: e})
			continue
		}
		kept = append(kept, e)
	}
	sort.Slice(lost, func(i, j int) bool { return lost[i].lost.svc.key < lost[j].lost.svc.key })
	return kept, lost
}

// parseRoute decodes and checks a route; the key's namespace and service
// are authoritative over the JSON's.
func parseRoute(b []byte, ns, svc string) (*servekv.Route, error) {
	var r servekv.Route
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("malformed JSON: %w", err)
	}
	r.Namespace, r.Service = ns, svc
	if r.ConsulService == "" {
		return nil, fmt.Errorf("no consul_service")
	}
	if !strings.HasPrefix(r.PathPrefix, "/") {
		return nil, fmt.Errorf("path_prefix %q does not start with /", r.PathPrefix)
	}
	if r.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("max_body_bytes %d is negative", r.MaxBodyBytes)
	}
	return &r, nil
}

// lookupService is a service by its Load name (tests).
func (g *Gateway) lookupService(key string) *service {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.services[key]
}
