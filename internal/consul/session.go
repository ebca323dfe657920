package consul

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/backoff"
	"github.com/gpujob/gpujob/internal/errlog"
)

// ErrSessionLost is what Session.Err wraps once Consul has answered that
// the session does not exist (TTL missed, node check failed, destroyed from
// outside). Nothing else counts as lost: an unreachable agent or a server
// without a leader is an outage, and the session survives it.
var ErrSessionLost = errors.New("consul session lost")

// ErrSessionClosed is what Session.Err wraps after Close.
var ErrSessionClosed = errors.New("consul session closed")

// SessionOptions describe a Consul session.
type SessionOptions struct {
	Name string
	// TTL is the session's TTL, at least 1s; the session is renewed
	// every TTL/2 (or half of what Consul says it keeps).
	TTL time.Duration
	// Behavior is what happens to the keys the session holds when it
	// ends: api.SessionBehaviorRelease (the default) or ...Delete.
	Behavior string
	// LockDelay is Consul's lock-delay for the keys the session holds,
	// sent as given: 0 is no delay, not Consul's default of 15 s (which
	// the API client's Session().Create would apply).
	LockDelay time.Duration
	// NodeChecks are the node health checks the session is bound to; nil
	// keeps Consul's default, the agent node's serfHealth, so that a node
	// Consul declares failed invalidates the session at once.
	NodeChecks []string
	// TTLOnly binds the session to no check at all: it lives exactly as
	// long as it is renewed. It excludes NodeChecks.
	TTLOnly bool
	// CreateOnce makes NewSession try once and return the error, for a
	// caller that runs its own retry loop (and must not have a session
	// made behind its back); by default NewSession retries transient
	// errors until its context ends.
	CreateOnce bool
	// Logf hears of failed requests (throttled, see internal/errlog);
	// optional.
	Logf func(format string, args ...any)
}

// Session is a Consul session kept alive by its own renewal loop, like
// etcd's concurrency.Session. Renewal retries transient errors for as long
// as it takes, with a backoff capped below the TTL: Consul re-arms every
// session's TTL (at twice the TTL) when a leader is elected, so a session
// outlives a server restart or an election as long as renewal resumes,
// which it does as soon as Consul answers again. Only Consul's answer that
// the session does not exist, confirmed by a consistent read, ends it.
type Session struct {
	client *api.Client
	id     string
	opts   SessionOptions
	errs   *errlog.Run

	stop     chan struct{} // closed by Close: stop renewing
	check    chan struct{} // a request found the session invalid: renew now
	stopOnce sync.Once
	renewed  chan struct{} // closed when the renewal loop has exited

	done     chan struct{} // closed when lost or closed
	doneOnce sync.Once
	mu       sync.Mutex
	err      error
}

// NewSession creates a session and starts renewing it. It retries
// transient errors until ctx ends, unless opts.CreateOnce.
func NewSession(ctx context.Context, client *api.Client, opts SessionOptions) (*Session, error) {
	switch {
	case opts.TTL < time.Second:
		return nil, fmt.Errorf("consul session %q: TTL %s: must be at least 1s", opts.Name, opts.TTL)
	case opts.TTLOnly && len(opts.NodeChecks) > 0:
		return nil, fmt.Errorf("consul session %q: TTLOnly and NodeChecks exclude each other", opts.Name)
	}
	if opts.Behavior == "" {
		opts.Behavior = api.SessionBehaviorRelease
	}
	// The raw request, because the API client leaves a LockDelay of 0
	// out and Consul then applies its default of 15 s.
	body := map[string]any{
		"Name":      opts.Name,
		"TTL":       opts.TTL.String(),
		"Behavior":  opts.Behavior,
		"LockDelay": opts.LockDelay.String(),
	}
	switch {
	case opts.TTLOnly:
		body["NodeChecks"] = []string{}
	case opts.NodeChecks != nil:
		body["NodeChecks"] = opts.NodeChecks
	}
	create := func(ctx context.Context) (string, error) {
		// A create cut off in flight may still be applied by Consul,
		// leaving a session that nobody renews or destroys. So a
		// cancellation of ctx stops further attempts, not this one.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
		defer cancel()
		var out struct{ ID string }
		if _, err := client.Raw().Write("/v1/session/create", body, &out, (&api.WriteOptions{}).WithContext(actx)); err != nil {
			return "", err
		}
		if out.ID == "" {
			return "", errors.New("consul returned no session ID")
		}
		return out.ID, nil
	}
	var id string
	var err error
	if opts.CreateOnce {
		id, err = create(ctx)
	} else {
		err = Retry(ctx, opts.Logf, "create consul session "+opts.Name, nil, func(ctx context.Context) error {
			var err error
			id, err = create(ctx)
			return err
		})
	}
	if err != nil {
		return nil, fmt.Errorf("create consul session %q: %w", opts.Name, err)
	}
	if ctx.Err() != nil {
		// Created for a caller that has gone: do not leave it behind.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
		defer cancel()
		_, _ = client.Session().Destroy(id, (&api.WriteOptions{}).WithContext(dctx))
		return nil, fmt.Errorf("create consul session %q: %w", opts.Name, ctx.Err())
	}
	s := &Session{
		client:  client,
		id:      id,
		opts:    opts,
		errs:    errlog.NewRetrying(opts.Logf, "renew consul session "+id+" ("+opts.Name+")"),
		stop:    make(chan struct{}),
		renewed: make(chan struct{}),
		check:   make(chan struct{}, 1),
		done:    make(chan struct{}),
	}
	go s.renew()
	return s, nil
}

// ID is the Consul session ID.
func (s *Session) ID() string { return s.id }

// Client is the Consul client the session was created with.
func (s *Session) Client() *api.Client { return s.client }

// Done closes when the session is lost for good or closed.
func (s *Session) Done() <-chan struct{} { return s.done }

// Err is nil while the session lives, then an error wrapping
// ErrSessionLost or ErrSessionClosed.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Lost reports whether Consul has said the session does not exist.
func (s *Session) Lost() bool { return errors.Is(s.Err(), ErrSessionLost) }

// Check asks the renewal loop to renew now rather than at its next turn:
// a request under the session was refused, perhaps because the session is
// gone, and if so Done should close without waiting up to TTL/2.
func (s *Session) Check() {
	select {
	case s.check <- struct{}{}:
	default:
	}
}

func (s *Session) end(err error) {
	s.doneOnce.Do(func() {
		s.mu.Lock()
		s.err = err
		s.mu.Unlock()
		close(s.done)
	})
}

// renew renews at TTL/2. On an error it retries with backoff capped below
// the TTL, so that a renewal lands within the TTL Consul re-arms when it
// comes back. It stops on Close or when Consul confirms the session gone.
func (s *Session) renew() {
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
	ttl := s.opts.TTL
	bo := backoff.New(DefaultBackoffBase, min(DefaultBackoffCap, ttl/4))
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
		// One renewal must not hang past the TTL on a dead connection.
		rctx, rcancel := context.WithTimeout(ctx, max(ttl/2, time.Second))
		entry, _, err := s.client.Session().Renew(s.id, (&api.WriteOptions{}).WithContext(rctx))
		rcancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			s.errs.Failed(err)
			wait = bo.Next()
		case entry == nil:
			// Consul answered 404. A server that has just become leader
			// answers from a state store that may not have applied the
			// whole raft log yet, and can say a live session does not
			// exist; only a consistent read, which Consul serves once it
			// is caught up, decides.
			lost, err := s.confirmLost(ctx)
			if ctx.Err() != nil {
				return
			}
			if lost {
				s.errs.OK()
				s.end(fmt.Errorf("%w: consul says session %s (%s) does not exist", ErrSessionLost, s.id, s.opts.Name))
				return
			}
			if err == nil {
				err = errors.New("not found by renew, but a consistent read still finds it")
			}
			s.errs.Failed(err)
			wait = bo.Next()
		default:
			s.errs.OK()
			bo.Reset()
			// Consul may raise the TTL; renew at half of what it says.
			if t, err := time.ParseDuration(entry.TTL); err == nil && t > 0 {
				ttl = t
			}
			wait = ttl / 2
		}
	}
}

// confirmLost asks Consul, with a consistent read, whether the session
// exists; lost is true only when Consul answered that it does not.
func (s *Session) confirmLost(ctx context.Context) (lost bool, err error) {
	rctx, cancel := context.WithTimeout(ctx, max(s.opts.TTL/2, time.Second))
	defer cancel()
	entry, _, err := s.client.Session().Info(s.id, (&api.QueryOptions{RequireConsistent: true}).WithContext(rctx))
	if err != nil {
		return false, err
	}
	return entry == nil, nil
}

// StopRenewing ends the renewal loop and waits for it, leaving the
// session to expire at its TTL (Done does not close). Close does this
// first; on its own it serves a caller that wants its keys to outlive it
// for a TTL.
func (s *Session) StopRenewing() {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.renewed
}

// Close stops renewing and destroys the session, retrying transient errors
// until ctx ends. Destroying a session releases or deletes the keys it
// holds (its Behavior). If Close gives up, Consul still invalidates the
// session once its TTL runs out. Done is closed when Close returns.
func (s *Session) Close(ctx context.Context) error {
	s.StopRenewing()
	if s.Lost() {
		return nil
	}
	s.end(fmt.Errorf("%w: %s (%s)", ErrSessionClosed, s.id, s.opts.Name))
	err := Retry(ctx, s.opts.Logf, "destroy consul session "+s.id, nil, func(ctx context.Context) error {
		_, err := s.client.Session().Destroy(s.id, (&api.WriteOptions{}).WithContext(ctx))
		return err
	})
	if err != nil {
		return fmt.Errorf("destroy consul session %s (%s): %w", s.id, s.opts.Name, err)
	}
	return nil
}
