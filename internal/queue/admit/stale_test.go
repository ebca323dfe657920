package admit

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// A controller restarted in its allocation (same ID) after a kill -9 leads
// at once, not after the dead run's session expires; a controller of
// another ID leaves a live-looking session alone.
func TestRestartedControllerEndsItsOwnStaleLead(t *testing.T) {
	for _, tc := range []struct {
		id    string
		leads bool
	}{{"c1", true}, {"c2", false}} {
		t.Run(tc.id, func(t *testing.T) {
			f := newFixture(t, 1, 4)
			// The dead run's session: a long TTL, never renewed again.
			sid, _, err := f.client.Session().Create(&api.SessionEntry{Name: "dead run", TTL: "60s", LockDelay: time.Millisecond,
				Behavior: api.SessionBehaviorRelease, Checks: []string{}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = f.client.Session().Destroy(sid, nil) })
			if ok, _, err := f.client.KV().Acquire(&api.KVPair{Key: f.c.leaderKey(), Value: []byte("c1"), Session: sid}, nil); err != nil || !ok {
				t.Fatalf("the dead run's lead: %v %v", ok, err)
			}
			c := f.controller(tc.id)
			c.Resync = time.Hour
			ctx, cancel := context.WithCancel(ctxOf(t))
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx) }()
			deadline := time.Now().Add(5 * time.Second)
			led := false
			for time.Now().Before(deadline) && !led {
				_, err := c.leaderSession()
				led = err == nil
				time.Sleep(20 * time.Millisecond)
			}
			cancel()
			if err := <-done; err != nil {
				t.Errorf("run: %v", err)
			}
			if led != tc.leads {
				t.Fatalf("controller %s led within 5 s of starting: %v, want %v (the stale session's TTL is 60 s)", tc.id, led, tc.leads)
			}
			if info, _, err := f.client.Session().Info(sid, nil); err != nil || (info == nil) != tc.leads {
				t.Errorf("the dead run's session after controller %s started: %+v (%v)", tc.id, info, err)
			}
		})
	}
}
