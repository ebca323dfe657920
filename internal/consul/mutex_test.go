package consul

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// lockAsync runs m.Lock in a goroutine; the channel gets its result.
func lockAsync(ctx context.Context, m *Mutex) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- m.Lock(ctx) }()
	return ch
}

func holder(t *testing.T, c *api.Client, key string) string {
	t.Helper()
	p, _, err := c.KV().Get(key, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p == nil {
		return ""
	}
	return p.Session
}

func TestMutexContention(t *testing.T) {
	c := newClient(t)
	key := uniqueKey(t)
	a := NewMutex(newSession(t, c, SessionOptions{}), key, MutexOptions{Value: []byte("a")})
	b := NewMutex(newSession(t, c, SessionOptions{}), key, MutexOptions{Value: []byte("b")})
	ctx := testCtx(t)
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if !a.Held() || holder(t, c, key) != a.Session().ID() {
		t.Fatal("a does not hold the lock it took")
	}
	if err := b.TryLock(ctx); !errors.Is(err, ErrLocked) {
		t.Fatalf("TryLock while held: %v, want ErrLocked", err)
	}
	got := lockAsync(ctx, b)
	// b waits in a blocking query; it must not have the lock while a
	// holds it. One write to the key (a's value again, same session)
	// wakes b's query, which must go back to waiting.
	if _, err := c.KV().Put(&api.KVPair{Key: key, Value: []byte("a")}, nil); err != nil {
		t.Fatal(err)
	}
	if closedWithin(got, 300*time.Millisecond) {
		t.Fatal("b's Lock returned while a held the lock")
	}
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if a.Held() {
		t.Error("Held after Unlock")
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("b did not take the released lock")
	}
	p, _, _ := c.KV().Get(key, nil)
	if p == nil || p.Session != b.Session().ID() || string(p.Value) != "b" {
		t.Fatalf("key after hand-over: %+v", p)
	}
	if err := a.Unlock(ctx); !errors.Is(err, ErrNotHeld) {
		t.Errorf("second Unlock: %v, want ErrNotHeld", err)
	}
}

func TestMutexLockEndsWithTheContext(t *testing.T) {
	c := newClient(t)
	key := uniqueKey(t)
	a := NewMutex(newSession(t, c, SessionOptions{}), key, MutexOptions{})
	b := NewMutex(newSession(t, c, SessionOptions{}), key, MutexOptions{})
	if err := a.Lock(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(testCtx(t))
	got := lockAsync(ctx, b)
	cancel()
	select {
	case err := <-got:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Lock after cancel: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Lock did not return when its context ended")
	}
}

func TestSessionLossReleasesTheLock(t *testing.T) {
	c := newClient(t)
	for _, tc := range []struct {
		name     string
		behavior string
	}{
		{"release", api.SessionBehaviorRelease},
		{"delete", api.SessionBehaviorDelete},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := uniqueKey(t)
			sa := newSession(t, c, SessionOptions{Behavior: tc.behavior})
			a := NewMutex(sa, key, MutexOptions{})
			b := NewMutex(newSession(t, c, SessionOptions{}), key, MutexOptions{})
			ctx := testCtx(t)
			if err := a.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			got := lockAsync(ctx, b)
			if _, err := c.Session().Destroy(sa.ID(), nil); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-got:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the lock of a lost session did not pass on")
			}
			sa.Check()
			if !closedWithin(sa.Done(), 2*time.Second) || a.Held() {
				t.Fatal("a still thinks it holds the lock of its lost session")
			}
			if err := a.Lock(ctx); !errors.Is(err, ErrSessionLost) {
				t.Errorf("Lock on a lost session: %v, want ErrSessionLost", err)
			}
		})
	}
}

func TestMutexHonoursLockDelay(t *testing.T) {
	c := newClient(t)
	key := uniqueKey(t)
	const delay = 2 * time.Second
	sa := newSession(t, c, SessionOptions{LockDelay: delay})
	a := NewMutex(sa, key, MutexOptions{LockDelay: delay})
	b := NewMutex(newSession(t, c, SessionOptions{}), key, MutexOptions{LockDelay: delay})
	ctx := testCtx(t)
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	// An invalidated session (not a clean release) starts the lock-delay.
	invalidated := time.Now()
	if _, err := c.Session().Destroy(sa.ID(), nil); err != nil {
		t.Fatal(err)
	}
	if holder(t, c, key) != "" {
		t.Fatal("the key is still held after its session was destroyed")
	}
	if err := b.TryLock(ctx); !errors.Is(err, ErrLocked) {
		t.Fatalf("TryLock within the lock-delay: %v, want ErrLocked", err)
	}
	if err := b.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	waited := time.Since(invalidated)
	if waited < delay-200*time.Millisecond {
		t.Errorf("took the lock %s after the holder was invalidated, within its lock-delay %s", waited, delay)
	}
	if waited > delay+3*time.Second {
		t.Errorf("took the lock %s after the holder was invalidated: too long after the lock-delay %s", waited, delay)
	}
}

// The autoscaler's key is also taken by consulapi.Lock in gateways of the
// previous release: a Mutex with LockFlagValue must exclude it, and leave
// the key in a form it accepts.
func TestMutexIsCompatibleWithConsulapiLock(t *testing.T) {
	c := newClient(t)
	key := uniqueKey(t)
	m := NewMutex(newSession(t, c, SessionOptions{}), key, MutexOptions{Value: []byte("new"), Flags: api.LockFlagValue})
	ctx := testCtx(t)
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	old := newSession(t, c, SessionOptions{})
	lock, err := c.LockOpts(&api.LockOptions{Key: key, Value: []byte("old"), Session: old.ID(), LockTryOnce: true, LockWaitTime: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if lost, err := lock.Lock(nil); err != nil || lost != nil {
		t.Fatalf("consulapi.Lock while the Mutex holds the key: lost=%v err=%v, want neither", lost, err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	lost, err := lock.Lock(nil)
	if err != nil || lost == nil {
		t.Fatalf("consulapi.Lock after Unlock: %v (a conflict means the flags differ)", err)
	}
	_ = lock.Unlock()
	// And the other way round: the Mutex takes a key consulapi.Lock
	// released.
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestMutexOnWaitSeesEachHolderOnce(t *testing.T) {
	c := newClient(t)
	key := uniqueKey(t)
	sa := newSession(t, c, SessionOptions{})
	a := NewMutex(sa, key, MutexOptions{Value: []byte("a")})
	ctx := testCtx(t)
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	// The waiter ends its predecessor's session, as the sweep controller
	// does with a controller of its own allocation.
	var seen []string
	b := NewMutex(newSession(t, c, SessionOptions{}), key, MutexOptions{OnWait: func(ctx context.Context, holder *api.KVPair) {
		seen = append(seen, string(holder.Value))
		if _, err := c.Session().Destroy(holder.Session, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
			t.Error(err)
		}
	}})
	if err := b.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 1 || seen[0] != "a" {
		t.Fatalf("OnWait saw %v, want [a]", seen)
	}
}
