package autoscale

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/gpujob/gpujob/internal/servekv"
	consulapi "github.com/hashicorp/consul/api"
)

func TestReporterPublishesKicksAndCleansUp(t *testing.T) {
	c := newClient(t)
	_, gw := testPrefixes(t)
	key := servekv.LoadKey(gw, "gw-1")
	name := servekv.LoadName("team", "bert")
	box := &loadBox{}
	box.set(name, 3, 1)

	// An interval far beyond the test: every publication after the first
	// is a Kick's.
	r := NewReporter(c, gw, "gw-1", box.snapshot, time.Hour)
	r.Logf = logTo(t)
	stop := runBg(t, 5*time.Second, r.Run)

	var pair *consulapi.KVPair
	eventually(t, 5*time.Second, "no load report appeared", func() bool {
		p, _, err := c.KV().Get(key, nil)
		pair = p
		return err == nil && p != nil
	})
	var l servekv.Load
	if err := json.Unmarshal(pair.Value, &l); err != nil {
		t.Fatalf("report %q: %v", pair.Value, err)
	}
	if l.Gateway != "gw-1" || l.Inflight[name] != 3 || l.Queued[name] != 1 || time.Since(l.Updated) > time.Minute {
		t.Fatalf("report = %+v, want gateway gw-1, 3 in flight and 1 queued for %s, updated now", l, name)
	}
	if pair.Session == "" {
		t.Fatal("the report is not held by a session")
	}
	se, _, err := c.Session().Info(pair.Session, nil)
	if err != nil || se == nil {
		t.Fatalf("session %s: %v %v", pair.Session, se, err)
	}
	if se.Behavior != consulapi.SessionBehaviorDelete || se.TTL != "10s" {
		t.Errorf("session = behavior %q TTL %q, want delete and 10s", se.Behavior, se.TTL)
	}

	// Past the spacing of publications, a Kick publishes at once.
	time.Sleep(2 * kickSpacing)
	box.set(name, 7, 0)
	kicked := time.Now()
	r.Kick()
	index := pair.ModifyIndex
	for {
		p, meta, err := c.KV().Get(key, (&consulapi.QueryOptions{WaitIndex: index, WaitTime: 2 * time.Second}).WithContext(context.Background()))
		if err != nil {
			t.Fatal(err)
		}
		index = meta.LastIndex
		if p != nil && json.Unmarshal(p.Value, &l) == nil && l.Inflight[name] == 7 {
			break
		}
		if time.Since(kicked) > 2*time.Second {
			t.Fatal("a Kick did not publish the new load")
		}
	}
	if d := time.Since(kicked); d > 300*time.Millisecond {
		t.Errorf("the Kick's report took %s, want under 300ms", d)
	}

	// A storm of Kicks (a request queued every 3 ms) is coalesced to a
	// publication per kickSpacing.
	time.Sleep(2 * kickSpacing)
	before := box.count()
	start := time.Now()
	for time.Since(start) < 300*time.Millisecond {
		r.Kick()
		time.Sleep(3 * time.Millisecond)
	}
	time.Sleep(2 * kickSpacing)
	if n := box.count() - before; n < 2 || n > 5 {
		t.Errorf("%d publications for 300ms of Kicks every 3ms, want 2 to 5", n)
	}

	stop()
	if p, _, err := c.KV().Get(key, nil); err != nil || p != nil {
		t.Errorf("after Run returned: report %v (err %v), want it gone", p, err)
	}
	if s := sessionsNamed(t, c, "gpujob-gateway-load"); len(s) != 0 {
		t.Errorf("after Run returned: %d sessions left: %+v", len(s), s[0])
	}
}

// TestReporterTakesBackItsKeyAfterLosingTheSession destroys the reporter's
// session from outside (as Consul does when a TTL runs out during an
// outage): the report disappears with it, and the reporter puts it back
// under a new session.
func TestReporterTakesBackItsKeyAfterLosingTheSession(t *testing.T) {
	c := newClient(t)
	_, gw := testPrefixes(t)
	key := servekv.LoadKey(gw, "gw-2")
	box := &loadBox{}
	r := NewReporter(c, gw, "gw-2", box.snapshot, 200*time.Millisecond)
	r.Logf = logTo(t)
	runBg(t, 5*time.Second, r.Run)

	var first string
	eventually(t, 5*time.Second, "no load report appeared", func() bool {
		p, _, err := c.KV().Get(key, nil)
		if err == nil && p != nil {
			first = p.Session
		}
		return first != ""
	})
	if _, err := c.Session().Destroy(first, nil); err != nil {
		t.Fatal(err)
	}
	// The next publication fails, which has the session checked at once
	// rather than at the next renewal (TTL/2 = 5 s away).
	eventually(t, 3*time.Second, "the report did not come back under a new session", func() bool {
		p, _, err := c.KV().Get(key, nil)
		return err == nil && p != nil && p.Session != "" && p.Session != first
	})
}
