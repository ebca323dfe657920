package gateway

import (
	"testing"
	"time"
)

func TestWindowStats(t *testing.T) {
	var w window
	t0 := time.Unix(1_000_000, 0)
	// 100 requests over 10 s: 98 at 5 ms, two at 200 ms, one of them a 502.
	for i := 0; i < 100; i++ {
		d, code := 5*time.Millisecond, 200
		if i == 40 {
			d, code = 200*time.Millisecond, 502
		}
		if i == 90 {
			d = 200 * time.Millisecond
		}
		w.add(t0.Add(time.Duration(i)*100*time.Millisecond), d, code)
	}
	s := w.stats(t0.Add(10 * time.Second))
	if s.Requests != 100 || s.Errors != 1 {
		t.Errorf("requests %d errors %d", s.Requests, s.Errors)
	}
	if s.RPS < 9.9 || s.RPS > 10.1 {
		t.Errorf("rps %.2f, want 10", s.RPS)
	}
	if s.P50Ms < 5 || s.P50Ms > 5.6 {
		t.Errorf("p50 %.2f ms, want 5 (+10%%)", s.P50Ms)
	}
	if s.P99Ms < 200 || s.P99Ms > 221 {
		t.Errorf("p99 %.2f ms, want 200 (+10%%)", s.P99Ms)
	}
	// A minute later the window has forgotten them.
	if s := w.stats(t0.Add(80 * time.Second)); s.Requests != 0 || s.P99Ms != 0 {
		t.Errorf("after the window: %+v", s)
	}
	// A client that went away is no server error.
	w.add(t0.Add(81*time.Second), time.Millisecond, statusClientClosed)
	if s := w.stats(t0.Add(81 * time.Second)); s.Errors != 0 || s.Requests != 1 {
		t.Errorf("499 counted as an error: %+v", s)
	}
}
