package autoscale

import (
	"context"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/consul"
)

// Retry pacing of failed Consul and Nomad requests: short at first (an agent
// restart or a leader election is over in seconds), capped so that the
// gateway works again within seconds of Consul coming back.
const (
	backoffBase = 100 * time.Millisecond
	backoffCap  = 5 * time.Second
)

// sessionTTL is the TTL of the reporter's and the autoscaler's sessions:
// the time after which a gateway that died without cleaning up loses its
// load report and its lock (Consul waits up to twice that).
const sessionTTL = 10 * time.Second

// requestTimeout bounds the destroy of a session when Run returns.
const requestTimeout = 3 * time.Second

// newSession creates a session of the reporter or the autoscaler
// (retrying until ctx ends). The package manages its sessions itself so
// that Run can destroy them before it returns: a stopped gateway leaves no
// session, no lock and no load report behind, and no goroutine that still
// talks to Consul.
func newSession(ctx context.Context, client *consulapi.Client, name, behavior string, lockDelay time.Duration, logf func(string, ...any)) (*consul.Session, error) {
	return consul.NewSession(ctx, client, consul.SessionOptions{
		Name: name, TTL: sessionTTL, Behavior: behavior, LockDelay: lockDelay, Logf: logf,
	})
}

// closeSession destroys s (one bounded try), which deletes or releases the
// keys it holds. If it fails, Consul still invalidates the session when its
// TTL runs out.
func closeSession(s *consul.Session, logf func(string, ...any)) {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	if err := s.Close(ctx); err != nil {
		logf("%v (it expires within %s)", err, 2*sessionTTL)
	}
}
