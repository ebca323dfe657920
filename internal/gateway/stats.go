package gateway

import (
	"encoding/json"
	"math"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/gpujob/gpujob/internal/servekv"
)

// StatsPath serves the gateway's recent figures per service as JSON
// (servekv.GatewayStats), for `gpujob service status`: Prometheus has the
// same in counters and histograms, but a CLI should not need a Prometheus.
const StatsPath = "/-/stats"

// statsWindow is how far back /-/stats looks.
const statsWindow = 60 * time.Second

// latency buckets: geometric from 0.1 ms by 10 %, past 10 minutes at the
// last one; a percentile is exact to within a bucket's 10 %.
var latencyBounds = func() []float64 {
	var b []float64
	for v := 0.1; v < 600_000; v *= 1.1 {
		b = append(b, v)
	}
	return b
}()

// second is one second of a service's requests.
type second struct {
	at       int64 // Unix second; a bucket of another second is stale
	requests int64
	errors   int64
	hist     []uint32 // len(latencyBounds)+1
}

// window is a service's last statsWindow seconds of requests.
type window struct {
	mu    sync.Mutex
	secs  [int(statsWindow / time.Second)]second
	first time.Time
}

func (w *window) add(now time.Time, d time.Duration, code int) {
	ms := float64(d) / float64(time.Millisecond)
	i := sort.SearchFloat64s(latencyBounds, ms)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.first.IsZero() {
		w.first = now
	}
	sec := now.Unix()
	b := &w.secs[sec%int64(len(w.secs))]
	if b.at != sec || b.hist == nil {
		*b = second{at: sec, hist: make([]uint32, len(latencyBounds)+1)}
	}
	b.requests++
	if code >= 500 && code != statusClientClosed {
		b.errors++
	}
	b.hist[i]++
}

func (w *window) stats(now time.Time) servekv.Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := servekv.Stats{Window: statsWindow.String()}
	if w.first.IsZero() {
		return s
	}
	hist := make([]uint64, len(latencyBounds)+1)
	oldest := now.Unix() - int64(len(w.secs)) + 1
	for i := range w.secs {
		b := &w.secs[i]
		if b.at < oldest || b.at > now.Unix() || b.hist == nil {
			continue
		}
		s.Requests += b.requests
		s.Errors += b.errors
		for j, n := range b.hist {
			hist[j] += uint64(n)
		}
	}
	span := min(now.Sub(w.first), statsWindow).Seconds()
	if span < 1 {
		span = 1
	}
	s.RPS = float64(s.Requests) / span
	s.P50Ms = percentile(hist, s.Requests, 0.50)
	s.P99Ms = percentile(hist, s.Requests, 0.99)
	return s
}

// percentile is the upper bound of the bucket holding the q-th request.
func percentile(hist []uint64, n int64, q float64) float64 {
	if n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(n)))
	var seen uint64
	for i, c := range hist {
		seen += c
		if seen >= rank {
			if i < len(latencyBounds) {
				return math.Round(latencyBounds[i]*100) / 100
			}
			return latencyBounds[len(latencyBounds)-1]
		}
	}
	return 0
}

// Stats is the gateway's figures per routed service.
func (g *Gateway) Stats(now time.Time) servekv.GatewayStats {
	out := servekv.GatewayStats{Gateway: g.cfg.ID, Services: map[string]servekv.Stats{}}
	for _, s := range g.serviceList() {
		st := s.window.stats(now)
		st.Inflight = int(s.inflight.Load())
		st.Queued = int(s.queued.Load())
		out.Services[s.key] = st
	}
	return out
}

func (g *Gateway) serveStats(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(g.Stats(time.Now()))
}
