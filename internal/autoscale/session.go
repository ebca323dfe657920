package autoscale

import (
	"context"
	"errors"
	"fmt"
	"github.com/gpujob/gpujob/internal/errlog"
	"sync"
	"time"

	"github.com/gpujob/gpujob/internal/backoff"
	consulapi "github.com/hashicorp/consul/api"
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

// requestTimeout bounds one session create, renew or destroy, so that a
// dead connection cannot hold a renewal past the TTL or a shutdown forever.
const requestTimeout = 3 * time.Second

// session is a Consul session of the reporter or the autoscaler, renewed
// every TTL/2 by its own goroutine until destroyed. The package manages its
// sessions itself (rather than letting consulapi.Lock create one) so that
// Run can destroy them before it returns: a stopped gateway leaves no
// session, no lock and no load report behind, and no goroutine that still
// talks to Consul.
type session struct {
	client *consulapi.Client
	id     string
	name   string
	errs   *errlog.Run

	lost     chan struct{} // closed when Consul says the session is gone
	stop     chan struct{} // closed by destroy
	stopOnce sync.Once
	renewed  chan struct{} // closed when the renewal loop has returned
	check    chan struct{} // a request under the session failed: renew now
}

// sessionSpec is what a session is created with.
type sessionSpec struct {
	Name     string
	Behavior string // consulapi.SessionBehaviorDelete or ...Release
	// LockDelay is how long Consul refuses the keys the session held to
	// anyone after the session is invalidated (not after a clean release).
	LockDelay time.Duration
}

// newSession creates a session, retrying with backoff until ctx ends, and
// starts renewing it.
func newSession(ctx context.Context, client *consulapi.Client, spec sessionSpec, logf func(string, ...any)) (*session, error) {
	// The API's Session().Create leaves a LockDelay of 0 out of the request
	// and Consul then applies its default of 15 s; the raw request can say
	// exactly what we want.
	body := map[string]any{
		"Name":      spec.Name,
		"TTL":       sessionTTL.String(),
		"Behavior":  spec.Behavior,
		"LockDelay": spec.LockDelay.String(),
	}
	errs := errlog.New(logf, "creating consul session "+spec.Name)
	bo := backoff.New(backoffBase, backoffCap)
	for {
		// A create cut off in flight may still be applied by Consul and
		// leave a session that nobody renews or destroys, so ctx ending
		// stops further attempts, not this one.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
		var out struct{ ID string }
		_, err := client.Raw().Write("/v1/session/create", body, &out, (&consulapi.WriteOptions{}).WithContext(actx))
		cancel()
		if err == nil && out.ID == "" {
			err = errors.New("consul returned no session ID")
		}
		if err == nil {
			errs.OK()
			s := &session{
				client: client, id: out.ID, name: spec.Name,
				errs: errlog.New(logf, "renewing consul session "+spec.Name),
				lost: make(chan struct{}), stop: make(chan struct{}), renewed: make(chan struct{}),
				check: make(chan struct{}, 1),
			}
			if ctx.Err() != nil {
				// Created for a caller that has gone: leave nothing behind.
				s.destroy()
				return nil, ctx.Err()
			}
			go s.renew()
			return s, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		errs.Failed(err)
		if !bo.Wait(ctx) {
			return nil, ctx.Err()
		}
	}
}

// renew renews at TTL/2 and retries errors with a backoff capped below the
// TTL, so that a renewal lands within the TTL Consul re-arms when it comes
// back after an outage. It ends on destroy or when Consul confirms that the
// session no longer exists.
func (s *session) renew() {
	defer close(s.renewed)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	bo := backoff.New(backoffBase, min(backoffCap, sessionTTL/4))
	ttl := sessionTTL
	wait := ttl / 2
	for {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-s.check:
			t.Stop()
		case <-t.C:
		}
		rctx, rcancel := context.WithTimeout(ctx, requestTimeout)
		entry, _, err := s.client.Session().Renew(s.id, (&consulapi.WriteOptions{}).WithContext(rctx))
		rcancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			s.errs.Failed(err)
			wait = bo.Next()
		case entry == nil:
			// A server that has just become leader may answer from a
			// state store that has not applied the whole log yet; only a
			// consistent read decides that the session is gone.
			rctx, rcancel := context.WithTimeout(ctx, requestTimeout)
			info, _, err := s.client.Session().Info(s.id, (&consulapi.QueryOptions{RequireConsistent: true}).WithContext(rctx))
			rcancel()
			if ctx.Err() != nil {
				return
			}
			if err == nil && info == nil {
				s.errs.Failed(fmt.Errorf("consul says session %s no longer exists", s.id))
				close(s.lost)
				return
			}
			if err == nil {
				err = errors.New("renew found no session but a consistent read does")
			}
			s.errs.Failed(err)
			wait = bo.Next()
		default:
			s.errs.OK()
			bo.Reset()
			// Consul may raise the TTL it keeps; renew at half of that.
			if t, err := time.ParseDuration(entry.TTL); err == nil && t > 0 {
				ttl = t
			}
			wait = ttl / 2
		}
	}
}

// checkNow asks for a renewal at once: a request under the session failed,
// perhaps because the session is gone, and the sooner that is known, the
// sooner its user makes a new one.
func (s *session) checkNow() {
	select {
	case s.check <- struct{}{}:
	default:
	}
}

// isLost reports whether Consul has said the session is gone.
func (s *session) isLost() bool {
	select {
	case <-s.lost:
		return true
	default:
		return false
	}
}

// destroy stops renewing and destroys the session (one attempt, bounded),
// which deletes or releases the keys it holds. If it fails, Consul still
// invalidates the session when its TTL runs out.
func (s *session) destroy() {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.renewed
	if s.isLost() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	if _, err := s.client.Session().Destroy(s.id, (&consulapi.WriteOptions{}).WithContext(ctx)); err != nil {
		s.errs.Logf("destroying consul session %s (%s): %v (it expires within %s)", s.id, s.name, err, 2*sessionTTL)
	}
}
