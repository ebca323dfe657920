package autoscale

import (
	"strings"
	"testing"
	"time"

	"github.com/gpujob/gpujob/internal/servekv"
)

func TestDecide(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	sec := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Second) }
	d := func(n int) servekv.Duration { return servekv.Duration(time.Duration(n) * time.Second) }
	base := servekv.Autoscale{Min: 0, Max: 3, TargetInflight: 2}
	with := func(f func(*servekv.Autoscale)) servekv.Autoscale { as := base; f(&as); return as }

	cases := []struct {
		name    string
		as      servekv.Autoscale
		s       State
		now     time.Time
		desired int
		reason  string // exact when it has no "…"; else every part must appear
		check   func(t *testing.T, next State)
	}{
		{
			name: "up at once", as: base,
			s:   State{Current: 1, Inflight: 4, Gateways: 2},
			now: sec(0), desired: 2,
			reason: "4 requests in flight across 2 gateways, target 2 per replica: 1 → 2 replicas",
			check: func(t *testing.T, n State) {
				if n.Current != 2 || !n.LastChange.Equal(sec(0)) || !n.AboveSince.IsZero() {
					t.Errorf("next = %+v, want Current 2, LastChange now, no window", n)
				}
			},
		},
		{
			name: "queued requests count as load", as: base,
			s:   State{Current: 1, Inflight: 2, Queued: 3, Gateways: 1},
			now: sec(0), desired: 3,
			reason: "2 requests in flight and 3 queued across 1 gateway, target 2 per replica: 1 → 3 replicas",
		},
		{
			name: "clamped to max", as: base,
			s:   State{Current: 1, Inflight: 20, Gateways: 1},
			now: sec(0), desired: 3,
			reason: "20 requests in flight…(capped at the maximum of 3): 1 → 3 replicas",
		},
		{
			name: "min floor: no load keeps Min and opens no window",
			as:   with(func(as *servekv.Autoscale) { as.Min = 1 }),
			s:    State{Current: 1, Gateways: 1},
			now:  sec(0), desired: 1, reason: "",
			check: func(t *testing.T, n State) {
				if !n.BelowSince.IsZero() {
					t.Errorf("BelowSince = %v, want zero: Min is not below Current", n.BelowSince)
				}
			},
		},
		{
			name: "scale-down stops at Min",
			as:   with(func(as *servekv.Autoscale) { as.Min = 1 }),
			s:    State{Current: 3, Gateways: 1},
			now:  sec(0), desired: 1,
			reason: "0 requests in flight across 1 gateway…no more than 1 replica wanted for the last 0s: 3 → 1 replica",
		},
		{
			name: "current below Min is raised at once",
			as:   with(func(as *servekv.Autoscale) { as.Min = 2; as.ScaleUpDelay = d(60) }),
			s:    State{Current: 0},
			now:  sec(0), desired: 2,
			reason: "0 replicas is below the minimum of 2: 0 → 2 replicas",
		},
		{
			name: "current above Max is lowered at once, and the window for further down starts",
			as:   with(func(as *servekv.Autoscale) { as.ScaleDownDelay = d(10) }),
			s:    State{Current: 5, Inflight: 2, Gateways: 1},
			now:  sec(0), desired: 3,
			reason: "5 replicas is above the maximum of 3: 5 → 3 replicas",
			check: func(t *testing.T, n State) {
				if n.Current != 3 || !n.BelowSince.Equal(sec(0)) || n.WindowMax != 1 {
					t.Errorf("next = %+v, want Current 3, BelowSince now, WindowMax 1", n)
				}
			},
		},
		{
			name: "scale from zero with queued requests ignores the up delay",
			as:   with(func(as *servekv.Autoscale) { as.ScaleUpDelay = d(60) }),
			s:    State{Current: 0, Queued: 1, Gateways: 1},
			now:  sec(0), desired: 1,
			reason: "1 request queued with no replica to take it across 1 gateway: 0 → 1 replica",
		},
		{
			name: "scale from zero goes straight to what the queue wants",
			as:   base,
			s:    State{Current: 0, Queued: 5, Gateways: 2},
			now:  sec(0), desired: 3,
			reason: "5 requests queued with no replica to take them across 2 gateways: 0 → 3 replicas",
		},
		{
			name: "scale from zero respects Min",
			as:   with(func(as *servekv.Autoscale) { as.Min = 2; as.TargetInflight = 10 }),
			s:    State{Current: 0, Queued: 1, Gateways: 1},
			now:  sec(0), desired: 2,
		},
		{
			name: "in-flight requests at zero replicas wait for the up delay",
			as:   with(func(as *servekv.Autoscale) { as.ScaleUpDelay = d(5) }),
			s:    State{Current: 0, Inflight: 1, Gateways: 1},
			now:  sec(0), desired: 0, reason: "",
			check: func(t *testing.T, n State) {
				if !n.AboveSince.Equal(sec(0)) {
					t.Errorf("AboveSince = %v, want now", n.AboveSince)
				}
			},
		},
		{
			name: "up delay not yet over",
			as:   with(func(as *servekv.Autoscale) { as.ScaleUpDelay = d(10) }),
			s:    State{Current: 1, Inflight: 6, Gateways: 1, AboveSince: sec(0)},
			now:  sec(9), desired: 1, reason: "",
			check: func(t *testing.T, n State) {
				if !n.AboveSince.Equal(sec(0)) {
					t.Errorf("AboveSince = %v, want kept at %v", n.AboveSince, sec(0))
				}
			},
		},
		{
			name: "up delay over",
			as:   with(func(as *servekv.Autoscale) { as.ScaleUpDelay = d(10) }),
			s:    State{Current: 1, Inflight: 6, Gateways: 1, AboveSince: sec(0)},
			now:  sec(10), desired: 3,
			reason: "6 requests in flight across 1 gateway, target 2 per replica: 1 → 3 replicas",
		},
		{
			name: "down: the window opens, nothing changes yet",
			as:   with(func(as *servekv.Autoscale) { as.ScaleDownDelay = d(10) }),
			s:    State{Current: 3, Inflight: 1, Gateways: 1},
			now:  sec(0), desired: 3, reason: "",
			check: func(t *testing.T, n State) {
				if !n.BelowSince.Equal(sec(0)) || n.WindowMax != 1 || n.Current != 3 {
					t.Errorf("next = %+v, want BelowSince now, WindowMax 1, Current 3", n)
				}
			},
		},
		{
			name: "down: not before the delay",
			as:   with(func(as *servekv.Autoscale) { as.ScaleDownDelay = d(10) }),
			s:    State{Current: 3, Gateways: 1, BelowSince: sec(0), WindowMax: 0},
			now:  sec(9), desired: 3, reason: "",
		},
		{
			name: "down: after the delay",
			as:   with(func(as *servekv.Autoscale) { as.ScaleDownDelay = d(10) }),
			s:    State{Current: 3, Gateways: 1, BelowSince: sec(0), WindowMax: 0},
			now:  sec(10), desired: 0,
			reason: "0 requests in flight across 1 gateway, target 2 per replica, and no more than 0 replicas wanted for the last 10s: 3 → 0 replicas",
			check: func(t *testing.T, n State) {
				if !n.BelowSince.IsZero() || n.WindowMax != 0 || !n.LastChange.Equal(sec(10)) || n.Current != 0 {
					t.Errorf("next = %+v, want the window closed and LastChange now", n)
				}
			},
		},
		{
			name: "down: a dip within the window goes only to the window's max",
			as:   with(func(as *servekv.Autoscale) { as.ScaleDownDelay = d(10) }),
			s:    State{Current: 3, Gateways: 1, BelowSince: sec(0), WindowMax: 2},
			now:  sec(10), desired: 2,
			reason: "…no more than 2 replicas wanted for the last 10s: 3 → 2 replicas",
		},
		{
			name: "down: the window's max grows with the load",
			as:   with(func(as *servekv.Autoscale) { as.ScaleDownDelay = d(10) }),
			s:    State{Current: 3, Inflight: 3, Gateways: 1, BelowSince: sec(0), WindowMax: 1},
			now:  sec(5), desired: 3, reason: "",
			check: func(t *testing.T, n State) {
				if n.WindowMax != 2 || !n.BelowSince.Equal(sec(0)) {
					t.Errorf("next = %+v, want WindowMax 2 and the window kept", n)
				}
			},
		},
		{
			name: "down: load back at Current closes the window",
			as:   with(func(as *servekv.Autoscale) { as.ScaleDownDelay = d(10) }),
			s:    State{Current: 3, Inflight: 6, Gateways: 1, BelowSince: sec(0), WindowMax: 1},
			now:  sec(20), desired: 3, reason: "",
			check: func(t *testing.T, n State) {
				if !n.BelowSince.IsZero() || n.WindowMax != 0 {
					t.Errorf("next = %+v, want the window closed", n)
				}
			},
		},
		{
			name: "no target: one request per replica",
			as:   servekv.Autoscale{Max: 5},
			s:    State{Current: 1, Inflight: 4, Gateways: 1},
			now:  sec(0), desired: 4,
			reason: "…target 1 per replica: 1 → 4 replicas",
		},
		{
			name: "a fractional target",
			as:   servekv.Autoscale{Max: 10, TargetInflight: 1.5},
			s:    State{Current: 1, Inflight: 4, Gateways: 1},
			now:  sec(0), desired: 3,
			reason: "…target 1.5 per replica: 1 → 3 replicas",
		},
		{
			name: "no gateway reporting",
			as:   base,
			s:    State{Current: 2},
			now:  sec(0), desired: 0,
			reason: "0 requests in flight with no gateway reporting…: 2 → 0 replicas",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			desired, reason, next := Decide(c.as, c.s, c.now)
			if desired != c.desired {
				t.Errorf("desired = %d, want %d (reason %q)", desired, c.desired, reason)
			}
			if parts := strings.Split(c.reason, "…"); len(parts) == 1 {
				if c.reason != "" || desired == c.s.Current {
					if reason != c.reason {
						t.Errorf("reason = %q\nwant     %q", reason, c.reason)
					}
				}
			} else {
				for _, p := range parts {
					if !strings.Contains(reason, p) {
						t.Errorf("reason = %q, want it to contain %q", reason, p)
					}
				}
			}
			if desired != c.s.Current && reason == "" {
				t.Error("a change without a reason")
			}
			if next.Current != desired {
				t.Errorf("next.Current = %d, want %d", next.Current, desired)
			}
			lo, hi := max(c.as.Min, 0), max(c.as.Max, c.as.Min)
			if desired < lo || desired > hi {
				t.Errorf("desired %d outside [%d, %d]", desired, lo, hi)
			}
			if c.check != nil {
				c.check(t, next)
			}
		})
	}
}

// TestDecideOverTime runs the rule through a load that spikes, dips and
// recovers, with the state each decision returns, as the autoscaler does.
func TestDecideOverTime(t *testing.T) {
	as := servekv.Autoscale{Min: 1, Max: 4, TargetInflight: 2, ScaleUpDelay: servekv.Duration(2 * time.Second),
		ScaleDownDelay: servekv.Duration(5 * time.Second)}
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	s := State{Current: 1}
	steps := []struct {
		at       int // seconds
		inflight int
		want     int
	}{
		{0, 2, 1},  // at target
		{1, 8, 1},  // over: the up delay starts
		{2, 8, 1},  // 1 s over
		{3, 8, 4},  // 2 s over: up
		{4, 1, 4},  // down window opens (wants 1)
		{6, 5, 4},  // wants 3: window max 3
		{8, 0, 4},  // dip
		{9, 0, 3},  // 5 s below: down to the window's max, not to 1
		{10, 0, 3}, // a new window: one decision at a time
		{14, 0, 3},
		{15, 0, 1}, // 5 s more: down to Min
		{20, 0, 1}, // stays at Min
	}
	for _, st := range steps {
		s.Inflight, s.Gateways = st.inflight, 1
		var reason string
		var got int
		got, reason, s = Decide(as, s, t0.Add(time.Duration(st.at)*time.Second))
		if got != st.want {
			t.Fatalf("at %ds with %d in flight: desired %d (%q), want %d", st.at, st.inflight, got, reason, st.want)
		}
	}
}

func TestAggregateIgnoresStaleReports(t *testing.T) {
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	name := servekv.LoadName("team", "bert")
	other := servekv.LoadName("team", "gpt")
	reports := []servekv.Load{
		{Gateway: "a", Updated: now.Add(-time.Second),
			Inflight: map[string]int{name: 3, other: 50}, Queued: map[string]int{name: 1}},
		{Gateway: "b", Updated: now.Add(-StaleAfter), // exactly at the limit: still fresh
			Inflight: map[string]int{name: 2}},
		{Gateway: "c", Updated: now.Add(-StaleAfter - time.Millisecond), // stale
			Inflight: map[string]int{name: 100}, Queued: map[string]int{name: 100}},
		{Gateway: "d", Updated: now.Add(2 * time.Second), // clock ahead: fresh
			Inflight: map[string]int{name: 1}},
		{Gateway: "e", Updated: now, Inflight: map[string]int{other: 7}}, // fresh, nothing for name
		{Gateway: "f"}, // never stamped: stale
	}
	inflight, queued, gateways := Aggregate(reports, name, now)
	if inflight != 6 || queued != 1 || gateways != 4 {
		t.Errorf("Aggregate = %d in flight, %d queued, %d gateways; want 6, 1, 4", inflight, queued, gateways)
	}
	if i, q, g := Aggregate(nil, name, now); i != 0 || q != 0 || g != 0 {
		t.Errorf("Aggregate(nil) = %d, %d, %d", i, q, g)
	}
}
