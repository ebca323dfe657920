package consul

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// nextLeader waits for the next news on an Observe channel.
func nextLeader(t *testing.T, ch <-chan Leader) Leader {
	t.Helper()
	select {
	case l, ok := <-ch:
		if !ok {
			t.Fatal("Observe channel closed")
		}
		return l
	case <-time.After(5 * time.Second):
		t.Fatal("no news from Observe")
	}
	return Leader{}
}

func TestElectionHandOver(t *testing.T) {
	c := newClient(t)
	key := uniqueKey(t)
	ctx := testCtx(t)
	s1, s2 := newSession(t, c, SessionOptions{}), newSession(t, c, SessionOptions{})
	e1, e2 := NewElection(s1, key, MutexOptions{}), NewElection(s2, key, MutexOptions{})
	obs := e2.Observe(ctx)
	if l := nextLeader(t, obs); l.Session != "" {
		t.Fatalf("leader before any campaign: %+v", l)
	}
	if _, err := e1.Leader(ctx); !errors.Is(err, ErrNoLeader) {
		t.Fatalf("Leader before any campaign: %v", err)
	}
	if e1.IsLeader() {
		t.Fatal("IsLeader before Campaign")
	}
	if err := e1.Campaign(ctx, []byte("one")); err != nil {
		t.Fatal(err)
	}
	if l := nextLeader(t, obs); l.Session != s1.ID() || string(l.Value) != "one" {
		t.Fatalf("observed %+v, want one", l)
	}
	campaign2 := make(chan error, 1)
	go func() { campaign2 <- e2.Campaign(ctx, []byte("two")) }()
	if closedWithin(campaign2, 300*time.Millisecond) {
		t.Fatal("a second campaign won while the first leads")
	}
	if l, err := e2.Leader(ctx); err != nil || string(l.Value) != "one" {
		t.Fatalf("Leader = %+v, %v", l, err)
	}
	if err := e1.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(e1.Lost(), time.Second) {
		t.Error("Lost not closed after Resign")
	}
	if err := <-campaign2; err != nil {
		t.Fatal(err)
	}
	// Observe may show the moment in between (nobody) first.
	l := nextLeader(t, obs)
	if l.Session == "" {
		l = nextLeader(t, obs)
	}
	if l.Session != s2.ID() || string(l.Value) != "two" {
		t.Fatalf("observed %+v after hand-over, want two", l)
	}
	if err := e1.Resign(ctx); !errors.Is(err, ErrNotLeader) {
		t.Errorf("Resign twice: %v", err)
	}
}

func TestElectionLostSignal(t *testing.T) {
	c := newClient(t)
	for _, tc := range []struct {
		name    string
		breakIt func(t *testing.T, s *Session, key string)
	}{
		{"session destroyed", func(t *testing.T, s *Session, key string) {
			if _, err := c.Session().Destroy(s.ID(), nil); err != nil {
				t.Fatal(err)
			}
		}},
		{"key deleted", func(t *testing.T, s *Session, key string) {
			if _, err := c.KV().Delete(key, nil); err != nil {
				t.Fatal(err)
			}
		}},
		{"key released from outside", func(t *testing.T, s *Session, key string) {
			if _, _, err := c.KV().Release(&api.KVPair{Key: key, Session: s.ID()}, nil); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := uniqueKey(t)
			s := newSession(t, c, SessionOptions{})
			e := NewElection(s, key, MutexOptions{})
			if err := e.Campaign(testCtx(t), []byte("x")); err != nil {
				t.Fatal(err)
			}
			if closedWithin(e.Lost(), 200*time.Millisecond) {
				t.Fatal("Lost closed while leading")
			}
			tc.breakIt(t, s, key)
			if !closedWithin(e.Lost(), 5*time.Second) {
				t.Fatal("Lost did not close")
			}
			if e.IsLeader() {
				t.Error("IsLeader after Lost")
			}
		})
	}
}

func TestElectionCampaignEndsWithTheContext(t *testing.T) {
	c := newClient(t)
	key := uniqueKey(t)
	e1 := NewElection(newSession(t, c, SessionOptions{}), key, MutexOptions{})
	e2 := NewElection(newSession(t, c, SessionOptions{}), key, MutexOptions{})
	if err := e1.Campaign(testCtx(t), nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(testCtx(t), 200*time.Millisecond)
	defer cancel()
	if err := e2.Campaign(ctx, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Campaign: %v, want the context's deadline", err)
	}
}
