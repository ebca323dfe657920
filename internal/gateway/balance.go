package gateway

import (
	"math/rand/v2"
	"slices"
	"time"
)

// pick chooses the endpoint for one attempt: least outstanding requests by
// the power of two choices (two distinct endpoints drawn at random, the one
// with fewer in flight wins, a tie goes to the first drawn, itself random).
// Two random choices keep every gateway from herding onto the same
// least-loaded replica with stale counts, at a fraction of a full scan's
// contention. Endpoints already tried by this request are never picked
// again; ejected ones only when every untried one is ejected. nil when no
// endpoint is left.
func pick(eps []*endpoint, tried []string, now time.Time) *endpoint {
	var buf [16]*endpoint
	cands := buf[:0]
	for _, e := range eps {
		if !slices.Contains(tried, e.id) && !e.ejected(now) {
			cands = append(cands, e)
		}
	}
	if len(cands) == 0 {
		for _, e := range eps {
			if !slices.Contains(tried, e.id) {
				cands = append(cands, e)
			}
		}
	}
	return p2c(cands)
}

// p2c is the power of two choices over cands.
func p2c(cands []*endpoint) *endpoint {
	switch n := len(cands); n {
	case 0:
		return nil
	case 1:
		return cands[0]
	default:
		i := rand.IntN(n)
		j := rand.IntN(n - 1)
		if j >= i {
			j++
		}
		a, b := cands[i], cands[j]
		if b.load.inflight.Load() < a.load.inflight.Load() {
			return b
		}
		return a
	}
}
