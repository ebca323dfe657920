package gateway

import (
	"fmt"
	"net/http"
	"time"
)

// hold waits, for a request whose service has no healthy replica, until one
// appears: a service scaled to zero, or one starting, answers late instead
// of failing. The wait is bounded by the route's QueueLimit (held requests;
// default DefaultQueueLimit, negative = hold none) and QueueTimeout
// (default DefaultQueueTimeout); past either the answer is 503 with
// Retry-After. It returns 0 when the request may go on, else the status it
// answered (or statusClientClosed).
//
// Until the pool's first health query has answered, the request waits
// without counting as held: the service may well have replicas, and a
// scale from zero then would be wrong.
func (g *Gateway) hold(w http.ResponseWriter, r *http.Request, e *routeEntry) int {
	s := e.svc
	if st := s.pool.Load().snapshot(); len(st.eps) > 0 {
		return 0
	}
	limit := e.route.QueueLimit
	if limit == 0 {
		limit = DefaultQueueLimit
	}
	timeout := e.route.QueueTimeout.Std()
	if timeout <= 0 {
		timeout = DefaultQueueTimeout
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	held := false
	defer func() {
		if held {
			s.queued.Add(-1)
		}
	}()
	for {
		if s.removed.Load() {
			return g.unavailable(w, s, "its route was removed")
		}
		p := s.pool.Load()
		st := p.snapshot()
		if len(st.eps) > 0 {
			return 0
		}
		if st.stopped {
			if s.pool.Load() != p {
				// The route changed Consul service: applyKV put the new
				// pool in place before stopping this one.
				continue
			}
			return g.unavailable(w, s, "(the gateway is stopping)")
		}
		if st.loaded && !held {
			if limit < 0 || s.queued.Add(1) > int64(limit) {
				if limit >= 0 {
					s.queued.Add(-1)
				}
				return g.unavailable(w, s, fmt.Sprintf("and %d request(s) already held", max(limit, 0)))
			}
			held = true
			if g.cfg.OnQueued != nil {
				g.cfg.OnQueued(s.ns, s.name)
			}
		}
		select {
		case <-st.changed:
		case <-timer.C:
			return g.unavailable(w, s, "after waiting "+timeout.String())
		case <-r.Context().Done():
			return statusClientClosed
		}
	}
}

// unavailable answers 503 for a service without a healthy replica.
func (g *Gateway) unavailable(w http.ResponseWriter, s *service, why string) int {
	w.Header().Set("Retry-After", "1")
	writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("no healthy replica of %s %s", s.key, why))
	return http.StatusServiceUnavailable
}
