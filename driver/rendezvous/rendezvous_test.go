package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// group is a set of in-process members of one run.
type group struct {
	t     *testing.T
	runID string
	cfg   Config
	rs    []*Rendezvous
}

func memberName(i int) string { return fmt.Sprintf("train[%d]", i) }

func newGroup(t *testing.T, cfg Config, n int, lws func(i int) int) *group {
	t.Helper()
	c := needConsul(t)
	if cfg.Client == nil {
		cfg.Client = c
	}
	if cfg.RunID == "" {
		cfg.RunID = fmt.Sprintf("test/%s-%d", t.Name(), time.Now().UnixNano())
	}
	if cfg.Expected == nil {
		for i := 0; i < cfg.Max; i++ {
			cfg.Expected = append(cfg.Expected, memberName(i))
		}
	}
	g := &group{t: t, runID: cfg.RunID, cfg: cfg}
	for i := 0; i < n; i++ {
		g.add(i, lws)
	}
	t.Cleanup(func() { g.closeAll() })
	return g
}

func (g *group) add(i int, lws func(int) int) *Rendezvous {
	g.t.Helper()
	l := 1
	if lws != nil {
		l = lws(i)
	}
	r, err := New(g.cfg, Member{ID: fmt.Sprintf("alloc-%d-%d", i, time.Now().UnixNano()), Name: memberName(i), Addr: fmt.Sprintf("10.0.0.%d:29500", i), LocalWorldSize: l})
	if err != nil {
		g.t.Fatalf("New: %v", err)
	}
	if err := r.Open(context.Background()); err != nil {
		g.t.Fatalf("Open: %v", err)
	}
	g.rs = append(g.rs, r)
	return r
}

// joinAll joins the given members concurrently.
func joinAll(ctx context.Context, rs []*Rendezvous) ([]*Round, []error) {
	rounds, errs := make([]*Round, len(rs)), make([]error, len(rs))
	var wg sync.WaitGroup
	for i, r := range rs {
		wg.Add(1)
		go func() { defer wg.Done(); rounds[i], errs[i] = r.Join(ctx) }()
	}
	wg.Wait()
	return rounds, errs
}

func (g *group) mustJoin(ctx context.Context, rs []*Rendezvous) []*Round {
	g.t.Helper()
	rounds, errs := joinAll(ctx, rs)
	for i, err := range errs {
		if err != nil {
			g.t.Fatalf("member %d: Join: %v", i, err)
		}
	}
	checkAgree(g.t, rounds, memberIDs(rs))
	return rounds
}

func memberIDs(rs []*Rendezvous) []string {
	ids := make([]string, len(rs))
	for i, r := range rs {
		ids[i] = r.self.ID
	}
	return ids
}

func (g *group) doneAll(ctx context.Context, rounds []*Round) {
	for i, r := range g.rs {
		if i < len(rounds) && rounds[i] != nil {
			if err := r.Done(ctx, rounds[i]); err != nil {
				g.t.Errorf("Done: %v", err)
			}
		}
	}
}

// finish ends a run that went well: every member reports rounds done and
// closes, and nothing of the run is left in Consul.
func (g *group) finish(ctx context.Context, rounds []*Round) {
	g.t.Helper()
	g.doneAll(ctx, rounds)
	g.closeAll()
	assertClean(g.t, g.runID)
}

func (g *group) closeAll() {
	var wg sync.WaitGroup
	for _, r := range g.rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := r.Close(ctx); err != nil {
				g.t.Errorf("Close: %v", err)
			}
		}()
	}
	wg.Wait()
}

// checkAgree verifies that every member got the same round and consistent
// ranks: the member holding rounds[i] has ID ids[i], and its node rank
// must point at itself in the shared member list.
func checkAgree(t *testing.T, rounds []*Round, ids []string) {
	t.Helper()
	first := rounds[0]
	seen := map[int]bool{}
	for i, rd := range rounds {
		if rd.Number != first.Number || rd.Restarts != first.Restarts || !reflect.DeepEqual(rd.Members, first.Members) {
			t.Fatalf("member %d disagrees: %+v vs %+v", i, rd, first)
		}
		if rd.NodeRank < 0 || rd.NodeRank >= len(rd.Members) || rd.Members[rd.NodeRank].ID != ids[i] || seen[rd.NodeRank] {
			t.Fatalf("member %d (%s): bad node rank %d in %v", i, ids[i], rd.NodeRank, rd.Members)
		}
		seen[rd.NodeRank] = true
		off, ws := 0, 0
		for j, m := range rd.Members {
			if j < rd.NodeRank {
				off += m.LocalWorldSize
			}
			ws += m.LocalWorldSize
		}
		if rd.RankOffset != off || rd.WorldSize != ws || rd.Master != rd.Members[0] {
			t.Fatalf("member %d: offset %d world %d master %v; want %d %d %v", i, rd.RankOffset, rd.WorldSize, rd.Master, off, ws, rd.Members[0])
		}
	}
	for j := 1; j < len(first.Members); j++ {
		if naturalCompare(first.Members[j-1].Name, first.Members[j].Name) >= 0 {
			t.Fatalf("members not in natural name order: %v", first.Members)
		}
	}
}

func TestRoundComplete(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    int
		lws  func(int) int
	}{
		{"2 members", 2, func(i int) int { return i + 1 }},
		{"4 members mixed", 4, func(i int) int { return []int{2, 1, 3, 1}[i] }},
		{"12 members natural order", 12, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxTimeout(t, 30*time.Second)
			g := newGroup(t, Config{Min: tc.n, Max: tc.n, JoinTimeout: 20 * time.Second}, tc.n, tc.lws)
			rounds := g.mustJoin(ctx, g.rs)
			rd := rounds[0]
			if rd.Number != 1 || rd.Restarts != 0 || len(rd.Members) != tc.n {
				t.Fatalf("round %+v", rd)
			}
			for i, r := range rounds {
				// Names sort naturally, so train[i] is node rank i.
				if r.NodeRank != i || r.Master.Name != "train[0]" {
					t.Fatalf("member %d: node rank %d master %s", i, r.NodeRank, r.Master.Name)
				}
			}
			if tc.n == 4 && (rounds[2].RankOffset != 3 || rounds[3].RankOffset != 6 || rd.WorldSize != 7) {
				t.Fatalf("offsets: %d %d world %d", rounds[2].RankOffset, rounds[3].RankOffset, rd.WorldSize)
			}
			g.doneAll(ctx, rounds)
			g.closeAll()
			assertClean(t, g.runID)
		})
	}
}

func TestElasticLateJoiner(t *testing.T) {
	ctx := ctxTimeout(t, 40*time.Second)
	g := newGroup(t, Config{Min: 2, Max: 4, LastCall: time.Second, JoinTimeout: 20 * time.Second}, 3, nil)
	start := time.Now()
	rounds := g.mustJoin(ctx, g.rs)
	if took := time.Since(start); took < 900*time.Millisecond {
		t.Errorf("round completed after %s, before the 1s last call", took)
	}
	if len(rounds[0].Members) != 3 || rounds[0].Number != 1 {
		t.Fatalf("round 1: %+v", rounds[0])
	}
	watches := make([]<-chan Failure, 3)
	for i, r := range g.rs {
		watches[i] = r.Watch(ctx, rounds[i])
	}
	late := g.add(3, nil)
	lateRound := make(chan *Round, 1)
	go func() {
		rd, err := late.Join(ctx)
		if err != nil {
			t.Errorf("late Join: %v", err)
		}
		lateRound <- rd
	}()
	for i, w := range watches {
		select {
		case f, ok := <-w:
			if !ok || f.Member != "train[3]" {
				t.Fatalf("member %d: watch got %+v ok=%v, want the late joiner train[3]", i, f, ok)
			}
		case <-ctx.Done():
			t.Fatalf("member %d: watch did not fire", i)
		}
	}
	rounds2 := g.mustJoin(ctx, g.rs[:3])
	lr := <-lateRound
	if lr == nil {
		t.FailNow()
	}
	checkAgree(t, append(rounds2, lr), memberIDs(append(g.rs[:3:3], late)))
	if lr.Number != 2 || lr.Restarts != 0 || len(lr.Members) != 4 || lr.NodeRank != 3 {
		t.Fatalf("round 2: %+v", lr)
	}
	g.doneAll(ctx, append(rounds2, lr))
	g.closeAll()
	assertClean(t, g.runID)
}

func TestJoinTimeout(t *testing.T) {
	ctx := ctxTimeout(t, 30*time.Second)
	g := newGroup(t, Config{Min: 4, Max: 4, JoinTimeout: 2 * time.Second}, 3, nil)
	type result struct {
		err error
		at  time.Time
	}
	res := make([]result, 3)
	var wg sync.WaitGroup
	start := time.Now()
	for i, r := range g.rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Staggered arrivals: the first to arrive times out first
			// and the others must follow at once.
			time.Sleep(time.Duration(i) * 400 * time.Millisecond)
			_, err := r.Join(ctx)
			res[i] = result{err, time.Now()}
		}()
	}
	wg.Wait()
	var first, last time.Time
	for i, rs := range res {
		var te *JoinTimeoutError
		if !errors.As(rs.err, &te) {
			t.Fatalf("member %d: want JoinTimeoutError, got %v", i, rs.err)
		}
		if !reflect.DeepEqual(te.Missing, []string{"train[3]"}) || len(te.Joined) != 3 || te.Round != 1 {
			t.Fatalf("member %d: error %+v", i, te)
		}
		t.Logf("member %d: %v", i, rs.err)
		if first.IsZero() || rs.at.Before(first) {
			first = rs.at
		}
		if rs.at.After(last) {
			last = rs.at
		}
	}
	if spread := last.Sub(first); spread > 500*time.Millisecond {
		t.Errorf("members returned over %s; want all at once", spread)
	}
	if took := first.Sub(start); took < 1900*time.Millisecond || took > 4*time.Second {
		t.Errorf("first timeout after %s, want about 2s", took)
	}
	g.closeAll()
	assertClean(t, g.runID)
}

func TestFailRestartsGroup(t *testing.T) {
	ctx := ctxTimeout(t, 30*time.Second)
	g := newGroup(t, Config{Min: 4, Max: 4, MaxRestarts: 2, JoinTimeout: 20 * time.Second}, 4, nil)
	rounds := g.mustJoin(ctx, g.rs)
	watches := make([]<-chan Failure, 4)
	for i, r := range g.rs {
		watches[i] = r.Watch(ctx, rounds[i])
	}
	want := Failure{Member: "train[2]", Reason: "rank 5 exited", ExitCode: 137}
	if err := g.rs[2].Fail(ctx, rounds[2], want); err != nil {
		t.Fatalf("Fail: %v", err)
	}
	for i, w := range watches {
		f, ok := <-w
		if i == 2 {
			if ok {
				t.Errorf("the failing member's own watch delivered %+v", f)
			}
			continue
		}
		if !ok || f != want {
			t.Fatalf("member %d: watch got %+v ok=%v, want %+v", i, f, ok, want)
		}
	}
	// A second Fail of the same round (another rank dying too) is the
	// same event: it must not spend another restart.
	if err := g.rs[1].Fail(ctx, rounds[1], Failure{Reason: "also died", ExitCode: 1}); err != nil {
		t.Fatalf("second Fail: %v", err)
	}
	rounds2 := g.mustJoin(ctx, g.rs)
	if rounds2[0].Number != 2 || rounds2[0].Restarts != 1 {
		t.Fatalf("round 2: number %d restarts %d, want 2 and 1", rounds2[0].Number, rounds2[0].Restarts)
	}
	g.finish(ctx, rounds2)
}

func TestRestartsExhausted(t *testing.T) {
	ctx := ctxTimeout(t, 30*time.Second)
	g := newGroup(t, Config{Min: 3, Max: 3, MaxRestarts: 1, JoinTimeout: 20 * time.Second}, 3, nil)
	rounds := g.mustJoin(ctx, g.rs)
	if err := g.rs[0].Fail(ctx, rounds[0], Failure{Reason: "first crash", ExitCode: 1}); err != nil {
		t.Fatal(err)
	}
	rounds = g.mustJoin(ctx, g.rs)
	if rounds[0].Restarts != 1 {
		t.Fatalf("restarts %d", rounds[0].Restarts)
	}
	last := Failure{Member: "train[1]", Reason: "second crash", ExitCode: 3}
	if err := g.rs[1].Fail(ctx, rounds[1], last); err != nil {
		t.Fatal(err)
	}
	_, errs := joinAll(ctx, g.rs)
	for i, err := range errs {
		var re *RestartsExhaustedError
		if !errors.As(err, &re) || re.Restarts != 1 || re.Max != 1 || re.LastFailure != last {
			t.Fatalf("member %d: want RestartsExhaustedError{1,1,%v}, got %v", i, last, err)
		}
	}
	t.Log(errs[0])
	g.closeAll()
	assertClean(t, g.runID)
}

// leaderSession returns the session holding the coordinator lock.
func leaderSession(t *testing.T, runID string) string {
	p, _, err := testAgent.client.KV().Get(DefaultPrefix+"/"+runID+"/"+leaderKey, nil)
	if err != nil || p == nil {
		t.Fatalf("leader key: %v %v", p, err)
	}
	return p.Session
}

func TestSessionInvalidated(t *testing.T) {
	for _, tc := range []struct {
		name   string
		leader bool
	}{{"member", false}, {"coordinator", true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxTimeout(t, 30*time.Second)
			g := newGroup(t, Config{Min: 3, Max: 3, MaxRestarts: 3, JoinTimeout: 20 * time.Second}, 3, nil)
			rounds := g.mustJoin(ctx, g.rs)
			lead := leaderSession(t, g.runID)
			victim := -1
			for i, r := range g.rs {
				if (r.SessionID() == lead) == tc.leader {
					victim = i
					break
				}
			}
			watches := make([]<-chan Failure, 3)
			for i, r := range g.rs {
				watches[i] = r.Watch(ctx, rounds[i])
			}
			// Simulate node loss: the session goes away from outside.
			if _, err := testAgent.client.Session().Destroy(g.rs[victim].SessionID(), nil); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			for i, w := range watches {
				if i == victim {
					continue
				}
				select {
				case f, ok := <-w:
					if !ok || f.Member != memberName(victim) {
						t.Fatalf("member %d: watch got %+v ok=%v, want %s", i, f, ok, memberName(victim))
					}
				case <-ctx.Done():
					t.Fatalf("member %d: watch did not fire", i)
				}
			}
			t.Logf("watches fired %s after the session was destroyed", time.Since(start))
			g.closeAll()
			// The run did not finish: its state (round 2, one restart
			// used) stays for the rescheduled members; sessions don't.
			p, _, err := testAgent.client.KV().Get(DefaultPrefix+"/"+g.runID+"/"+roundKey, nil)
			if err != nil || p == nil {
				t.Fatalf("round record should be kept: %v", err)
			}
			if err := Purge(ctx, testAgent.client, "", g.runID); err != nil {
				t.Fatal(err)
			}
			assertClean(t, g.runID)
		})
	}
}

func TestDoneIsNotAFailure(t *testing.T) {
	ctx := ctxTimeout(t, 30*time.Second)
	g := newGroup(t, Config{Min: 3, Max: 3, JoinTimeout: 20 * time.Second}, 3, nil)
	rounds := g.mustJoin(ctx, g.rs)
	watches := make([]<-chan Failure, 3)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i, r := range g.rs {
		watches[i] = r.Watch(wctx, rounds[i])
	}
	// The coordinator finishes first and leaves: its lock moves on and
	// nobody restarts.
	lead := leaderSession(t, g.runID)
	first := 0
	for i, r := range g.rs {
		if r.SessionID() == lead {
			first = i
		}
	}
	if err := g.rs[first].Done(ctx, rounds[first]); err != nil {
		t.Fatal(err)
	}
	if err := g.rs[first].Close(ctx); err != nil {
		t.Fatal(err)
	}
	// Give a wrong failure time to show up, then look at every watch.
	time.Sleep(1500 * time.Millisecond)
	for i, w := range watches {
		if i == first {
			continue
		}
		select {
		case f, ok := <-w:
			t.Fatalf("member %d: watch fired after a member finished: %+v ok=%v", i, f, ok)
		default:
		}
	}
	if l := leaderSession(t, g.runID); l == lead || l == "" {
		t.Errorf("coordinator lock not taken over: %q", l)
	}
	for i, r := range g.rs {
		if i != first {
			if err := r.Done(ctx, rounds[i]); err != nil {
				t.Fatal(err)
			}
		}
	}
	g.closeAll()
	assertClean(t, g.runID)
}

func TestNewValidates(t *testing.T) {
	c, _ := api.NewClient(api.DefaultConfig())
	ok := Config{Client: c, RunID: "a/b", Min: 1, Max: 1}
	self := Member{ID: "x", LocalWorldSize: 1}
	for _, tc := range []struct {
		name string
		mod  func(*Config, *Member)
	}{
		{"no client", func(c *Config, _ *Member) { c.Client = nil }},
		{"no run id", func(c *Config, _ *Member) { c.RunID = "" }},
		{"min>max", func(c *Config, _ *Member) { c.Min, c.Max = 3, 2 }},
		{"min 0", func(c *Config, _ *Member) { c.Min = 0 }},
		{"ttl", func(c *Config, _ *Member) { c.SessionTTL = time.Millisecond }},
		{"restarts", func(c *Config, _ *Member) { c.MaxRestarts = -1 }},
		{"id slash", func(_ *Config, m *Member) { m.ID = "a/b" }},
		{"id dot-dot", func(_ *Config, m *Member) { m.ID = ".." }},
		{"run id leading slash", func(c *Config, _ *Member) { c.RunID = "/a/b" }},
		{"run id trailing slash", func(c *Config, _ *Member) { c.RunID = "a/b/" }},
		{"run id dot-dot", func(c *Config, _ *Member) { c.RunID = "default/../../x" }},
		{"run id dot", func(c *Config, _ *Member) { c.RunID = "default/./x" }},
		{"run id empty segment", func(c *Config, _ *Member) { c.RunID = "default//x" }},
		{"lws", func(_ *Config, m *Member) { m.LocalWorldSize = 0 }},
	} {
		cfg, m := ok, self
		tc.mod(&cfg, &m)
		if _, err := New(cfg, m); err == nil {
			t.Errorf("%s: New accepted %+v %+v", tc.name, cfg, m)
		}
	}
	r, err := New(ok, self)
	if err != nil {
		t.Fatal(err)
	}
	if r.cfg.Prefix != DefaultPrefix || r.cfg.SessionTTL != DefaultSessionTTL || r.cfg.JoinTimeout != DefaultJoinTimeout || r.self.Name != "x" {
		t.Errorf("defaults not applied: %+v", r.cfg)
	}
	if _, err := r.Join(context.Background()); err == nil {
		t.Error("Join before Open succeeded")
	}
}

func TestNaturalCompare(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"train[2]", "train[10]", -1},
		{"train[10]", "train[9]", 1},
		{"train[02]", "train[2]", 0},
		{"a", "b", -1},
		{"train[1]", "train[1]", 0},
		{"x", "x1", -1},
	} {
		if got := naturalCompare(tc.a, tc.b); got != tc.want {
			t.Errorf("naturalCompare(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}
