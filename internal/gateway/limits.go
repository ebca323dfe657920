package gateway

import (
	"fmt"
	"net/http"
	"sync/atomic"
)

// capacity is what the gateway as a whole takes on at once: routed requests
// in flight (held ones included, from the moment their headers are read
// until they are answered) and bytes of request bodies buffered. Past
// either, a request is shed with 503 and Retry-After, so that a flood
// costs the flooder retries and the gateway a bounded amount of memory,
// instead of the gateway its life.
type capacity struct {
	maxInflight int64
	inflight    atomic.Int64

	maxBuffered int64
	// smallReserve of maxBuffered is kept for bodies of at most
	// smallBodyBytes: large uploads, however many, cannot take the last of
	// it, so ordinary small requests still find room.
	smallReserve int64
	buffered     atomic.Int64
}

// smallBodyBytes is the largest body that may use capacity's reserve.
const smallBodyBytes = 64 << 10

func newCapacity(maxInflight int, maxBuffered int64) *capacity {
	return &capacity{maxInflight: int64(maxInflight), maxBuffered: maxBuffered, smallReserve: maxBuffered / 8}
}

// enter admits one more request in flight, or reports that the gateway is
// full; a true must be paired with leave.
func (c *capacity) enter() bool {
	if c.inflight.Add(1) > c.maxInflight {
		c.inflight.Add(-1)
		return false
	}
	return true
}

func (c *capacity) leave() { c.inflight.Add(-1) }

// largestBody is the largest body that can ever be buffered.
func (c *capacity) largestBody() int64 { return c.maxBuffered - c.smallReserve }

// reserve takes n bytes for a body that will then be total bytes long,
// or reports that there is no room; a true must be paired with release.
func (c *capacity) reserve(n, total int64) bool {
	limit := c.maxBuffered
	if total > smallBodyBytes {
		limit = c.largestBody()
	}
	for {
		cur := c.buffered.Load()
		if cur+n > limit {
			return false
		}
		if c.buffered.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

func (c *capacity) release(n int64) {
	if n > 0 {
		c.buffered.Add(-n)
	}
}

// Why a request was shed (gpujob_gateway_shed_total's reason).
const (
	shedInflight = "inflight"
	shedBuffer   = "buffer"
	shedSlowBody = "slow_body"
)

// shed answers a request the gateway has no room for: 503 with
// Retry-After, and the connection closed when the request's body is left
// unread (reading it would take in what there is no room for).
func (g *Gateway) shed(w http.ResponseWriter, reason string, closeConn bool) int {
	g.metrics.shed.WithLabelValues(reason).Inc()
	h := w.Header()
	h.Set("Retry-After", "1")
	if closeConn {
		h.Set("Connection", "close")
	}
	var msg string
	switch reason {
	case shedInflight:
		msg = fmt.Sprintf("gateway busy: %d requests in flight, its limit (--max-inflight)", g.cap.maxInflight)
	default:
		msg = fmt.Sprintf("gateway busy: its buffers for request bodies are full (--max-buffered %d bytes)", g.cap.maxBuffered)
	}
	writeError(w, http.StatusServiceUnavailable, msg)
	return http.StatusServiceUnavailable
}
