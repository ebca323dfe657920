package consul

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// scripted is a Query that answers from a script, one step per call, and
// records the WaitIndex of every call; after the script it ends the watch
// (cancel).
type scripted struct {
	steps  []step
	cancel context.CancelFunc
	calls  []uint64 // WaitIndex of each call
	called []time.Time
}

type step struct {
	index uint64
	err   error
}

func (s *scripted) query(q *api.QueryOptions) (uint64, *api.QueryMeta, error) {
	s.calls = append(s.calls, q.WaitIndex)
	s.called = append(s.called, time.Now())
	if len(s.calls) > len(s.steps) {
		s.calls, s.called = s.calls[:len(s.steps)], s.called[:len(s.steps)]
		s.cancel()
		return 0, nil, context.Canceled
	}
	st := s.steps[len(s.calls)-1]
	if st.err != nil {
		return 0, nil, st.err
	}
	return st.index, &api.QueryMeta{LastIndex: st.index}, nil
}

// runScript watches a script to its end and returns what was delivered.
func runScript(t *testing.T, s *scripted, opts WatchOptions) []uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s.cancel = cancel
	var got []uint64
	err := Watch(ctx, s.query, opts, func(v uint64, index uint64) error {
		if v != index {
			t.Errorf("delivered %d with index %d", v, index)
		}
		got = append(got, v)
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Watch: %v (calls %v)", err, s.calls)
	}
	return got
}

func TestWatchFollowsConsulsIndexRules(t *testing.T) {
	for _, tc := range []struct {
		name      string
		steps     []uint64
		wantWaits []uint64 // WaitIndex of each call
		delivered []uint64
	}{
		{"waits on the last index; a timeout is not news", []uint64{5, 5, 7}, []uint64{0, 5, 5}, []uint64{5, 7}},
		{"an index going backwards starts over", []uint64{9, 4, 4}, []uint64{0, 9, 0}, []uint64{9, 4}},
		{"never waits on index 0", []uint64{0, 0, 3}, []uint64{0, 1, 1}, []uint64{0, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &scripted{}
			for _, i := range tc.steps {
				s.steps = append(s.steps, step{index: i})
			}
			got := runScript(t, s, WatchOptions{MinGap: -1})
			if fmt.Sprint(s.calls) != fmt.Sprint(tc.wantWaits) {
				t.Errorf("WaitIndex of the calls = %v, want %v", s.calls, tc.wantWaits)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.delivered) {
				t.Errorf("delivered %v, want %v", got, tc.delivered)
			}
		})
	}
}

func TestWatchBacksOffOnErrorsAndSaysWhenItWorksAgain(t *testing.T) {
	boom := errors.New("boom")
	s := &scripted{steps: []step{{index: 2}, {err: boom}, {err: boom}, {err: boom}, {index: 3}}}
	var failing, recovered []int
	const base = 40 * time.Millisecond
	got := runScript(t, s, WatchOptions{
		MinGap: -1, BackoffBase: base, BackoffCap: time.Second, FailAfter: 2,
		OnFailing:   func(err error, n int) { failing = append(failing, n) },
		OnRecovered: func(n int) { recovered = append(recovered, n) },
	})
	if fmt.Sprint(got) != "[2 3]" {
		t.Errorf("delivered %v, want [2 3]", got)
	}
	if fmt.Sprint(failing) != "[2]" || fmt.Sprint(recovered) != "[3]" {
		t.Errorf("OnFailing %v, OnRecovered %v; want [2], [3]", failing, recovered)
	}
	// Retries are spaced by a growing backoff (with jitter: the n-th is
	// at least half of base·2ⁿ).
	for i, want := range []time.Duration{base / 2, base, 2 * base} {
		if gap := s.called[i+2].Sub(s.called[i+1]); gap < want {
			t.Errorf("retry %d after %s, want at least %s", i+1, gap, want)
		}
	}
	// The index of before the errors is kept.
	if s.calls[4] != 2 {
		t.Errorf("WaitIndex after the errors = %d, want 2", s.calls[4])
	}
}

func TestWatchSpacesQueriesByMinGap(t *testing.T) {
	s := &scripted{steps: []step{{index: 1}, {index: 2}, {index: 3}}}
	const gap = 100 * time.Millisecond
	runScript(t, s, WatchOptions{MinGap: gap})
	for i := 1; i < len(s.called); i++ {
		if d := s.called[i].Sub(s.called[i-1]); d < gap {
			t.Errorf("query %d came %s after the one before, want at least %s", i, d, gap)
		}
	}
}

func TestWatchPrefixAgainstConsul(t *testing.T) {
	c := newClient(t)
	prefix := uniqueKey(t) + "/"
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	ch := WatchChan(ctx, PrefixQuery(c, prefix), WatchOptions{})
	if pairs := <-ch; len(pairs) != 0 {
		t.Fatalf("first answer: %d keys, want none", len(pairs))
	}
	if _, err := c.KV().Put(&api.KVPair{Key: prefix + "a", Value: []byte("1")}, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case pairs := <-ch:
		if len(pairs) != 1 || string(pairs[0].Value) != "1" {
			t.Fatalf("after a put: %v", pairs)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the watch did not see the put")
	}
	cancel()
	for range ch {
	}
}

func TestWatchReturnsTheDeliverError(t *testing.T) {
	s := &scripted{steps: []step{{index: 1}}}
	want := errors.New("stop here")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.cancel = cancel
	err := Watch(ctx, s.query, WatchOptions{}, func(uint64, uint64) error { return want })
	if !errors.Is(err, want) {
		t.Fatalf("Watch = %v, want deliver's error", err)
	}
}

func TestNextIndex(t *testing.T) {
	for _, c := range []struct{ prev, last, next uint64 }{
		{0, 10, 10},
		{10, 10, 10},
		{10, 12, 12},
		{10, 5, 0}, // went backwards: start over
		{0, 0, 1},  // never wait on 0
		{1, 0, 0},  // backwards to 0: start over (the next answer then waits on at least 1)
	} {
		if got := NextIndex(c.prev, c.last); got != c.next {
			t.Errorf("NextIndex(%d, %d) = %d, want %d", c.prev, c.last, got, c.next)
		}
	}
}
