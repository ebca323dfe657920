package consul

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/backoff"
)

// Default pacing of retried Consul requests: short at first (an agent
// restart or a leader election is over in seconds), capped low so that a
// caller works again within seconds of Consul coming back.
const (
	DefaultBackoffBase = 50 * time.Millisecond
	DefaultBackoffCap  = 2 * time.Second
)

// requestTimeout bounds one session create or destroy that runs to
// completion although its caller has gone.
const requestTimeout = 3 * time.Second

// Transient reports whether a failed Consul request is worth retrying.
// Nobody can list every way a request fails while an agent restarts or a
// leader is elected (refused connections, EOF mid-response, "No cluster
// leader", timeouts), so everything is transient except a cancelled
// context and 4xx answers (bad request, ACL denied), which the same
// request will get again. 429 (rate limited) is transient.
func Transient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var se api.StatusError
	if errors.As(err, &se) {
		return se.Code >= 500 || se.Code == 429
	}
	return true
}

// IsInvalidSession reports whether Consul refused a request because the
// session it names does not exist (any more).
func IsInvalidSession(err error) bool {
	return err != nil && strings.Contains(err.Error(), "invalid session")
}

// Retry runs op until it succeeds, fails for good, or ctx ends (then the
// last error is returned wrapped with ctx's). isTransient says which errors
// are worth retrying (nil: Transient); logf, if set, hears of every
// transient failure as what. Retries are paced from DefaultBackoffBase to
// DefaultBackoffCap, with jitter.
func Retry(ctx context.Context, logf func(string, ...any), what string, isTransient func(error) bool, op func(context.Context) error) error {
	if isTransient == nil {
		isTransient = Transient
	}
	bo := backoff.New(DefaultBackoffBase, DefaultBackoffCap)
	for {
		err := op(ctx)
		if err == nil || !isTransient(err) {
			return err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w (last error: %w)", ctx.Err(), err)
		}
		if logf != nil {
			logf("%s: %v (retrying)", what, err)
		}
		if !bo.Wait(ctx) {
			return fmt.Errorf("%w (last error: %w)", ctx.Err(), err)
		}
	}
}
