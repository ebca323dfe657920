package rendezvous

import (
	"context"
	"errors"

	"github.com/gpujob/gpujob/internal/backoff"
	"github.com/gpujob/gpujob/internal/consul"
)

// Backoff between retries of a failed Consul request. The cap is low on
// purpose: it bounds how long a member keeps waiting after Consul is back
// (an outage of a minute must cost training nothing), and a thousand members
// retrying every 2 s is still a light load for a recovering server.
const (
	backoffBase = consul.DefaultBackoffBase // 50 ms
	backoffCap  = consul.DefaultBackoffCap  // 2 s
)

// newBackoff paces the rendezvous's retries (internal/backoff).
func newBackoff() *backoff.Backoff { return backoff.New(backoffBase, backoffCap) }

// permanentError marks an error that retrying cannot fix.
type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

func permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

// transient reports whether a failed Consul request is worth retrying. We
// cannot list every way a request fails while an agent restarts or a leader
// is elected (refused connections, EOF mid-response, "No cluster leader",
// timeouts), so everything is transient except what says otherwise: errors
// we marked permanent, the terminal rendezvous errors, a cancelled context,
// and 4xx answers (bad request, ACL denied), which the same request will get
// again. 429 (rate limited) is transient.
func transient(err error) bool {
	if err == nil {
		return false
	}
	var pe permanentError
	var te *JoinTimeoutError
	var xe *RestartsExhaustedError
	if errors.As(err, &pe) || errors.As(err, &te) || errors.As(err, &xe) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	return consul.Transient(err)
}

// retry runs op until it succeeds, fails permanently, or ctx ends (then
// the last error is returned wrapped with ctx's). logf, if set, hears of
// every transient failure.
func retry(ctx context.Context, logf func(string, ...any), what string, op func(context.Context) error) error {
	return consul.Retry(ctx, logf, what, transient, op)
}
