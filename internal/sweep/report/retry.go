package report

import (
	"time"

	"github.com/gpujob/gpujob/internal/backoff"
)

// Backoff between retries of a failed Consul request: short at first (an
// agent restart or a leader election is over in seconds), capped so that
// the reporter writes again within seconds of Consul coming back.
const (
	backoffBase = 100 * time.Millisecond
	backoffCap  = 5 * time.Second
)

// newBackoff paces the reporter's retries, capped at limit (and at
// backoffCap).
func newBackoff(limit time.Duration) *backoff.Backoff {
	return backoff.New(backoffBase, max(min(backoffCap, limit), backoffBase))
}
