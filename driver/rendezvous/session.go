package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"github.com/gpujob/gpujob/internal/backoff"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
)

// ErrSessionLost is what Session.Err wraps once Consul has answered that the
// session does not exist (TTL missed, node check failed, destroyed from
// outside). Nothing else counts as lost: an unreachable agent or a server
// without a leader is an outage, and the session survives it.
var ErrSessionLost = errors.New("consul session lost")

// sessionRequestTimeout bounds one session create or destroy that runs to
// completion although its caller has gone (see NewSession).
const sessionRequestTimeout = 3 * time.Second

// ErrSessionClosed is Session.Err after Close.
var ErrSessionClosed = errors.New("consul session closed")

// SessionOptions describe a Consul session.
type SessionOptions struct {
	Name      string
	TTL       time.Duration // renewed every TTL/2
	LockDelay time.Duration // Consul's lock-delay for the keys it holds
	// NodeChecks are the node health checks the session is bound to; nil
	// keeps Consul's default, the agent node's serfHealth, so a node that
	// Consul declares failed invalidates the session at once.
	NodeChecks []string
	// TTLOnly binds the session to no check at all: it lives exactly as
	// long as it is renewed. See Config.SessionTTLOnly.
	TTLOnly bool
	Logf    func(format string, args ...any) // transient errors; optional
}

// Session is a Consul session kept alive by its own renewal loop, like
// etcd's concurrency.Session. Renewal retries transient errors for as long
// as it takes; only Consul's answer that the session does not exist ends it.
// Consul re-arms every session's TTL (at twice the TTL) when a leader is
// elected, so a session outlives a server restart or a leader election as
// long as renewal resumes, which it does as soon as Consul answers again.
type Session struct {
	client *api.Client
	id     string
	opts   SessionOptions

	stop     chan struct{} // closed by Close: stop renewing
	check    chan struct{} // a request found the session invalid: renew now
	stopOnce sync.Once
	renewed  chan struct{} // closed when the renewal loop has exited

	done     chan struct{} // closed when lost or closed
	doneOnce sync.Once
	mu       sync.Mutex
	err      error
}

// NewSession creates a session, retrying transient errors until ctx ends,
// and starts renewing it.
func NewSession(ctx context.Context, client *api.Client, opts SessionOptions) (*Session, error) {
	if opts.TTL < time.Second {
		return nil, fmt.Errorf("session TTL %s: must be at least 1s", opts.TTL)
	}
	entry := &api.SessionEntry{
		Name:       opts.Name,
		Behavior:   api.SessionBehaviorDelete,
		TTL:        opts.TTL.String(),
		LockDelay:  opts.LockDelay,
		NodeChecks: opts.NodeChecks,
	}
	var id string
	err := retry(ctx, opts.Logf, "create consul session "+opts.Name, func(ctx context.Context) error {
		// A create cut off in flight may still be applied by Consul,
		// leaving a session that nobody renews or destroys. So a
		// cancellation of ctx stops further attempts, not this one.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sessionRequestTimeout)
		defer cancel()
		var err error
		wo := (&api.WriteOptions{}).WithContext(actx)
		if opts.TTLOnly {
			id, _, err = client.Session().CreateNoChecks(entry, wo)
		} else {
			id, _, err = client.Session().Create(entry, wo)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create consul session %q: %w", opts.Name, err)
	}
	if ctx.Err() != nil {
		// Created for a caller that has gone: do not leave it behind.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sessionRequestTimeout)
		defer cancel()
		_, _ = client.Session().Destroy(id, (&api.WriteOptions{}).WithContext(dctx))
		return nil, fmt.Errorf("create consul session %q: %w", opts.Name, ctx.Err())
	}
	s := &Session{
		client:  client,
		id:      id,
		opts:    opts,
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

// Done closes when the session is lost for good or closed.
func (s *Session) Done() <-chan struct{} { return s.done }

// Err is nil while the session lives, then an error wrapping ErrSessionLost
// or ErrSessionClosed.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Lost reports whether Consul has said the session does not exist.
func (s *Session) Lost() bool { return errors.Is(s.Err(), ErrSessionLost) }

// Check asks the renewal loop to renew now rather than at its next turn:
// a request was refused for an invalid session, and if Consul says the
// session is gone, Done should close without waiting up to TTL/2.
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
// comes back. It stops on Close or when Consul answers 404.
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
	bo := backoff.New(backoffBase, min(backoffCap, s.opts.TTL/4))
	ttl := s.opts.TTL
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
			if s.opts.Logf != nil {
				s.opts.Logf("renew consul session %s: %v (retrying)", s.id, err)
			}
			wait = bo.Next()
		case entry == nil:
			// A server that has just become leader answers from a state
			// store that has not yet applied the whole raft log, and
			// can say a live session does not exist. Only a consistent
			// read, which Consul serves once it is caught up, decides.
			lost, err := s.confirmLost(ctx)
			if ctx.Err() != nil {
				return
			}
			if lost {
				s.end(fmt.Errorf("%w: consul says session %s (%s) does not exist", ErrSessionLost, s.id, s.opts.Name))
				return
			}
			if s.opts.Logf != nil {
				if err == nil {
					err = errors.New("a consistent read still finds it")
				}
				s.opts.Logf("renew consul session %s: not found, not confirmed: %v (retrying)", s.id, err)
			}
			wait = bo.Next()
		default:
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

// Close stops renewing and destroys the session, retrying transient errors
// until ctx ends. Destroying a session deletes the keys it holds
// (Behavior=delete). If Close gives up, Consul still invalidates the session
// once its TTL runs out.
func (s *Session) Close(ctx context.Context) error {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.renewed
	if s.Lost() {
		return nil
	}
	s.end(fmt.Errorf("%w: %s", ErrSessionClosed, s.id))
	err := retry(ctx, s.opts.Logf, "destroy consul session "+s.id, func(ctx context.Context) error {
		_, err := s.client.Session().Destroy(s.id, (&api.WriteOptions{}).WithContext(ctx))
		return err
	})
	if err != nil {
		return fmt.Errorf("destroy consul session %s: %w", s.id, err)
	}
	return nil
}
