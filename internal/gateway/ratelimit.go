package gateway

import (
	"context"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/gpujob/gpujob/internal/servekv"
)

// allow applies the request's rate limit, answering 429 itself when it is
// over: per token (the token's Limit, else the route's) on routes with
// Auth, per client IP on routes without Auth but with a RateLimit.
func (g *Gateway) allow(w http.ResponseWriter, r *http.Request, e *routeEntry, b *bearer) bool {
	lim := e.route.RateLimit
	var key, scope string
	if b != nil {
		if b.token.Limit != nil {
			lim = b.token.Limit
		}
		scope = "token|" + e.svc.key
		key = scope + "|" + b.hash
	} else {
		scope = "ip|" + e.svc.key
		key = scope + "|" + clientNet(r)
	}
	if lim == nil {
		return true
	}
	ok, wait := g.limiters.allow(key, scope, *lim, time.Now())
	if ok {
		return true
	}
	w.Header().Set("Retry-After", strconv.Itoa(retryAfterSeconds(wait)))
	writeError(w, http.StatusTooManyRequests, "rate limit exceeded")
	return false
}

// retryAfterSeconds rounds a wait up to whole seconds, at least 1
// (Retry-After has no fractions, and 0 would invite an immediate retry).
func retryAfterSeconds(d time.Duration) int {
	return max(1, int(math.Ceil(d.Seconds())))
}

// clientNet is the client's address as the per-address limits see it:
// its IP, or for IPv6 its /64, which one host commonly holds whole (a
// limit per address would give it 2^64 buckets).
func clientNet(r *http.Request) string {
	ip := net.ParseIP(clientIP(r))
	if ip == nil {
		return clientIP(r)
	}
	if ip.To4() == nil {
		return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
	}
	return ip.String()
}

// limiterSet holds the token buckets by key. A bucket is replaced when its
// limit changes (a token or route rewritten), and dropped once idle long
// enough to have refilled, when it is the same as a new one. The set holds
// at most max buckets: clients (addresses, on a route with a rate limit and
// no auth, are as many as an attacker has) past that share one overflow
// bucket per scope (route and kind) until the full buckets are swept, so
// that a flood of new addresses costs bounded memory and, at worst, the
// newcomers' own rate.
type limiterSet struct {
	mu        sync.Mutex
	m         map[string]*limiterEntry
	max       int
	lastSweep time.Time
}

type limiterEntry struct {
	lim   *rate.Limiter
	limit servekv.Limit
	last  time.Time
}

func newLimiterSet(max int) *limiterSet { return &limiterSet{m: map[string]*limiterEntry{}, max: max} }

// overflowKey is the bucket the clients of scope share while the set is
// full.
func overflowKey(scope string) string { return scope + "|*overflow*" }

// bucket is a Limit as rate's parameters: a burst of at least 1 (a
// burst of 0 would refuse everything), and an RPS of 0 or less unlimited
// (servekv's writers validate limits; the gateway does not lock a service
// out over a bad one).
func bucket(l servekv.Limit) (rate.Limit, int, bool) {
	if l.RPS <= 0 || math.IsNaN(l.RPS) || math.IsInf(l.RPS, 0) {
		return 0, 0, false
	}
	burst := l.Burst
	if burst < 1 {
		burst = max(1, int(math.Ceil(l.RPS)))
	}
	return rate.Limit(l.RPS), burst, true
}

// allow takes one token from key's bucket (of scope) at now; when there
// is none it reports how long until there would be one, and takes nothing
// (the reservation is cancelled, so a refused request costs no capacity).
func (s *limiterSet) allow(key, scope string, l servekv.Limit, now time.Time) (bool, time.Duration) {
	r, burst, limited := bucket(l)
	if !limited {
		return true, 0
	}
	s.mu.Lock()
	e := s.m[key]
	if e == nil && len(s.m) >= s.max {
		// Full: drop the buckets that have refilled (they are the same as
		// new ones), at most once a second, since that is a scan of the
		// whole set; else share the scope's overflow bucket.
		if now.Sub(s.lastSweep) >= time.Second {
			s.lastSweep = now
			s.dropFull(now)
		}
		if len(s.m) >= s.max {
			key = overflowKey(scope)
			e = s.m[key]
		}
	}
	if e == nil || e.limit != l {
		e = &limiterEntry{lim: rate.NewLimiter(r, burst), limit: l}
		s.m[key] = e
	}
	e.last = now
	lim := e.lim
	s.mu.Unlock()

	res := lim.ReserveN(now, 1)
	if !res.OK() {
		return false, time.Second
	}
	d := res.DelayFrom(now)
	if d == 0 {
		return true, 0
	}
	res.CancelAt(now)
	return false, d
}

// dropFull drops the buckets that are full at now: forgetting them changes
// nothing. The caller holds mu.
func (s *limiterSet) dropFull(now time.Time) {
	for k, e := range s.m {
		if e.lim.TokensAt(now) >= float64(e.lim.Burst()) {
			delete(s.m, k)
		}
	}
}

// sweep drops the buckets idle for longer than a refill (and a minute, so
// a steady trickle does not churn them).
func (s *limiterSet) sweep(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, e := range s.m {
		refill := time.Duration(float64(e.lim.Burst()) / float64(e.lim.Limit()) * float64(time.Second))
		if now.Sub(e.last) > max(refill, time.Minute) {
			delete(s.m, k)
		}
	}
}

func (s *limiterSet) size() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// sweepEvery sweeps every d until ctx ends.
func (s *limiterSet) sweepEvery(ctx context.Context, d time.Duration) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s.sweep(now)
		}
	}
}
