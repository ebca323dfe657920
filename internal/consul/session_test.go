package consul

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

func TestNewSessionSendsItsOptionsAsGiven(t *testing.T) {
	c := newClient(t)
	for _, tc := range []struct {
		name      string
		opts      SessionOptions
		behavior  string
		lockDelay time.Duration
		checks    int // node checks Consul bound the session to
	}{
		{"defaults: release, no lock-delay, serfHealth", SessionOptions{}, api.SessionBehaviorRelease, 0, 1},
		{"delete with 1ms lock-delay", SessionOptions{Behavior: api.SessionBehaviorDelete, LockDelay: time.Millisecond}, api.SessionBehaviorDelete, time.Millisecond, 1},
		{"ttl only", SessionOptions{TTLOnly: true, LockDelay: 3 * time.Second}, api.SessionBehaviorRelease, 3 * time.Second, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSession(t, c, tc.opts)
			info, _, err := c.Session().Info(s.ID(), nil)
			if err != nil || info == nil {
				t.Fatalf("session info: %v %v", info, err)
			}
			if info.Behavior != tc.behavior || info.LockDelay != tc.lockDelay || len(info.NodeChecks)+len(info.Checks) != tc.checks {
				t.Errorf("got behavior %q lock-delay %s checks %v/%v, want %q %s %d", info.Behavior, info.LockDelay, info.NodeChecks, info.Checks, tc.behavior, tc.lockDelay, tc.checks)
			}
		})
	}
}

func TestSessionRejectsBadOptions(t *testing.T) {
	c := newClient(t)
	for _, opts := range []SessionOptions{
		{TTL: 500 * time.Millisecond},
		{TTL: time.Second, TTLOnly: true, NodeChecks: []string{"serfHealth"}},
	} {
		if _, err := NewSession(testCtx(t), c, opts); err == nil {
			t.Errorf("%+v: no error", opts)
		}
	}
}

func TestSessionOutlivesItsTTLWhileRenewed(t *testing.T) {
	c := newClient(t)
	s := newSession(t, c, SessionOptions{TTL: time.Second})
	// Three TTLs (Consul invalidates after up to 2×TTL): only renewal
	// keeps it.
	if closedWithin(s.Done(), 3*time.Second) {
		t.Fatalf("session ended while renewed: %v", s.Err())
	}
	if info, _, err := c.Session().Info(s.ID(), nil); err != nil || info == nil {
		t.Fatalf("session gone in consul: %v", err)
	}
}

func TestSessionDestroyedFromOutsideIsLost(t *testing.T) {
	c := newClient(t)
	s := newSession(t, c, SessionOptions{TTL: 10 * time.Second})
	if _, err := c.Session().Destroy(s.ID(), nil); err != nil {
		t.Fatal(err)
	}
	// Check renews now: the loss is seen at once, not TTL/2 later.
	s.Check()
	if !closedWithin(s.Done(), 2*time.Second) {
		t.Fatal("Done did not close after the session was destroyed")
	}
	if !errors.Is(s.Err(), ErrSessionLost) || !s.Lost() {
		t.Fatalf("Err = %v, want ErrSessionLost", s.Err())
	}
}

func TestSessionCloseDestroysAndReleasesKeys(t *testing.T) {
	c := newClient(t)
	s, err := NewSession(testCtx(t), c, SessionOptions{Name: t.Name(), TTL: 10 * time.Second, Behavior: api.SessionBehaviorDelete})
	if err != nil {
		t.Fatal(err)
	}
	key := uniqueKey(t)
	if ok, _, err := c.KV().Acquire(&api.KVPair{Key: key, Session: s.ID()}, nil); err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(s.Err(), ErrSessionClosed) || !closedWithin(s.Done(), time.Millisecond) {
		t.Fatalf("after Close: Err = %v", s.Err())
	}
	if info, _, _ := c.Session().Info(s.ID(), nil); info != nil {
		t.Error("session still exists after Close")
	}
	if p, _, _ := c.KV().Get(key, nil); p != nil {
		t.Error("Behavior=delete: the key outlived the session")
	}
}

func TestNewSessionCreateOnceDoesNotRetry(t *testing.T) {
	// Nothing listens on this address: one attempt fails at once.
	c, err := api.NewClient(&api.Config{Address: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := NewSession(ctx, c, SessionOptions{TTL: time.Second, CreateOnce: true}); err == nil {
		t.Fatal("no error")
	}
	if ctx.Err() != nil {
		t.Fatalf("CreateOnce retried until the context ended (%s)", time.Since(start))
	}
	// Without CreateOnce it retries until the context ends.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	if _, err := NewSession(ctx2, c, SessionOptions{TTL: time.Second}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the context's deadline", err)
	}
}
