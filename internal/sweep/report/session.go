package report

import (
	"context"
	"fmt"
	"github.com/gpujob/gpujob/internal/errlog"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
)

// session is the reporter's own Consul session, under which it holds the
// metrics record (a KV acquire), so that the record's Session is set
// exactly while this supervisor lives:
//
//   - Behavior release: when the session ends — Close destroys it, or
//     Consul invalidates it because the supervisor stopped renewing (it
//     died) or its node failed (the default serfHealth check) — the record
//     stays, with its Session cleared. A trial whose supervisor or node
//     died is never shown running, and its points are kept.
//   - LockDelay 0: Consul's default of 15 s would keep the next supervisor
//     of the trial (the group's new allocation on another node) from
//     taking the record over for that long after a node died. Nothing else
//     competes for the record, so the delay protects nothing here.
//
// It renews itself every TTL/2 until stopped, retrying errors with a
// backoff below the TTL, and says when Consul answers that it is gone.
type session struct {
	client *api.Client
	id     string
	ttl    time.Duration
	errs   *errlog.Run

	lost     chan struct{} // closed when Consul says the session does not exist
	stop     chan struct{}
	stopOnce sync.Once
	renewed  chan struct{} // closed when the renewal loop has returned
	check    chan struct{} // a request failed: renew now to learn whether it is lost
}

// createSession makes a session (one attempt) and starts renewing it;
// onLost is called once if Consul later answers that it is gone.
func createSession(ctx context.Context, client *api.Client, name string, ttl time.Duration, logf func(string, ...any), onLost func()) (*session, error) {
	// The API client's Session().Create leaves a LockDelay of 0 out of
	// the request, and Consul then applies its default of 15 s; the raw
	// request can say 0.
	body := map[string]any{
		"Name":      name,
		"TTL":       ttl.String(),
		"Behavior":  api.SessionBehaviorRelease,
		"LockDelay": "0s",
	}
	var out struct{ ID string }
	if _, err := client.Raw().Write("/v1/session/create", body, &out, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
		return nil, fmt.Errorf("creating a consul session: %w", err)
	}
	if out.ID == "" {
		return nil, fmt.Errorf("creating a consul session: consul returned no session ID")
	}
	s := &session{
		client: client, id: out.ID, ttl: ttl, errs: errlog.NewRetrying(logf, "renewing consul session "+out.ID),
		lost: make(chan struct{}), stop: make(chan struct{}), renewed: make(chan struct{}), check: make(chan struct{}, 1),
	}
	go s.renew(onLost)
	return s, nil
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

// checkNow asks for a renewal at once: a request under the session failed,
// perhaps because it is gone, and the sooner that is known, the sooner the
// reporter makes a new one and takes the record again.
func (s *session) checkNow() {
	select {
	case s.check <- struct{}{}:
	default:
	}
}

func (s *session) renew(onLost func()) {
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
	bo := newBackoff(s.ttl / 4)
	wait := s.ttl / 2
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
		rctx, rcancel := context.WithTimeout(ctx, max(s.ttl/2, time.Second))
		entry, _, err := s.client.Session().Renew(s.id, (&api.WriteOptions{}).WithContext(rctx))
		rcancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			s.errs.Failed(err)
			wait = bo.Next()
		case entry == nil:
			close(s.lost)
			onLost()
			return
		default:
			s.errs.OK()
			bo.Reset()
			wait = s.ttl / 2
			// Consul may raise the TTL it keeps; renew at half of that.
			if t, err := time.ParseDuration(entry.TTL); err == nil && t > 0 {
				wait = t / 2
			}
		}
	}
}

// stopRenewing ends the renewal loop and waits for it.
func (s *session) stopRenewing() {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.renewed
}

// destroy stops renewing and destroys the session (one attempt), which
// releases the record it holds.
func (s *session) destroy(ctx context.Context) error {
	s.stopRenewing()
	if s.isLost() {
		return nil
	}
	if _, err := s.client.Session().Destroy(s.id, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
		return fmt.Errorf("destroying consul session %s: %w", s.id, err)
	}
	return nil
}
