package main

import (
	"bufio"
	"math"
	"strings"
	"testing"
	"time"
)

func TestReadResponse(t *testing.T) {
	for _, c := range []struct {
		name   string
		in     string
		status int
		keep   bool
	}{
		{"content-length", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: x\r\n\r\nhello", 200, true},
		{"chunked with trailer", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n1\r\n!\r\n0\r\nX-T: 1\r\n\r\n", 200, true},
		{"connection close", "HTTP/1.1 401 Unauthorized\r\nConnection: close\r\nContent-Length: 2\r\n\r\nno", 401, false},
		{"interim then final", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n", 204, true},
		{"http/1.0 keep-alive", "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n", 200, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			// The next response must be read from where this one ended.
			br := bufio.NewReader(strings.NewReader(c.in + "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nz"))
			status, keep, err := readResponse(br)
			if err != nil || status != c.status || keep != c.keep {
				t.Fatalf("got %d %v %v, want %d %v", status, keep, err, c.status, c.keep)
			}
			if status, _, err := readResponse(br); err != nil || status != 200 {
				t.Fatalf("the next response: %d %v", status, err)
			}
		})
	}
	if _, _, err := readResponse(bufio.NewReader(strings.NewReader("garbage\r\n\r\n"))); err == nil {
		t.Fatal("no error for a malformed status line")
	}
}

func TestPercentileAndStat(t *testing.T) {
	v := make([]int64, 100)
	for i := range v {
		v[i] = int64(i + 1)
	}
	if p := percentile(v, 0.5); p != 50 {
		t.Errorf("p50 = %d, want 50", p)
	}
	if p := percentile(v, 0.99); p != 99 {
		t.Errorf("p99 = %d, want 99", p)
	}
	if p := percentile(v[:1], 0.99); p != 1 {
		t.Errorf("p99 of one = %d", p)
	}
	s := statOf([]float64{3, 1, 2, 10})
	if s.Median != 2.5 || s.Min != 1 || s.Max != 10 || s.N != 4 {
		t.Errorf("stat = %+v", s)
	}
	if s := statOf([]float64{5, 1, 3}); s.Median != 3 {
		t.Errorf("odd median = %v", s.Median)
	}
}

func TestSummarizeAddedOverDirectPerRound(t *testing.T) {
	r := &results{Runs: []armRun{
		{Arm: armDirect, Round: 1, RPS: 100, P50Ms: 20, P99Ms: 30},
		{Arm: armGateway, Round: 1, RPS: 90, P50Ms: 21.5, P99Ms: 35},
		{Arm: armHAProxy, Round: 1, RPS: 100, P50Ms: 20.5, P99Ms: 31},
		{Arm: armHAProxy, Round: 2, RPS: 50, P50Ms: 30, P99Ms: 40, OtherBusy: 0.5},
		{Arm: armDirect, Round: 2, RPS: 50, P50Ms: 29, P99Ms: 33},
		{Arm: armGateway, Round: 2, RPS: 50, P50Ms: 30, P99Ms: 39},
	}}
	r.summarize()
	if len(r.Summary.Arms) != 3 || r.Summary.Arms[0].Arm != armDirect || r.Summary.Arms[2].Arm != armHAProxy {
		t.Fatalf("arms = %+v", r.Summary.Arms)
	}
	gw := r.Summary.Arms[1]
	if gw.AddedP50Ms.Min != 1 || gw.AddedP50Ms.Max != 1.5 || gw.AddedP99Ms.Median != 5.5 {
		t.Errorf("gateway added = %+v %+v", gw.AddedP50Ms, gw.AddedP99Ms)
	}
	if s := r.Summary.GatewayOverHAProxyRPS; math.Abs(s.Median-0.95) > 1e-9 || s.N != 2 {
		t.Errorf("ratio = %+v", s)
	}
	if len(r.Summary.Targets) != 2 || !r.Summary.Targets[0].Met || r.Summary.Targets[1].Met {
		t.Errorf("targets = %+v", r.Summary.Targets)
	}
	if q := r.Summary.Quiet; len(q.Rounds) != 1 || q.Rounds[0] != 1 || q.GatewayAddedP50Ms.Median != 1.5 || q.HAProxyAddedP50Ms.Median != 0.5 {
		t.Errorf("quiet = %+v", q)
	}
	if md := r.markdown(); !strings.Contains(md, "| gateway | 70 (50–90)") {
		t.Errorf("markdown:\n%s", md)
	}
}

// recovery is the first whole second after the attack from which the
// requests' p99 (over the rest of the window, at least 5 s of it) is under
// the bound and none failed.
func TestAttackRecovery(t *testing.T) {
	end := time.Unix(1000, 0)
	stop := end.Add(10 * time.Second)
	at := func(s float64, lat time.Duration, ok bool) legitResult {
		return legitResult{start: end.Add(time.Duration(s * float64(time.Second))), lat: lat, ok: ok}
	}
	slow, fast := 200*time.Millisecond, 20*time.Millisecond
	var rs []legitResult
	for i := 0; i < 10; i++ {
		lat := fast
		if i < 2 {
			lat = slow
		}
		for j := 0; j < 50; j++ {
			rs = append(rs, at(float64(i)+float64(j)/50, lat, true))
		}
	}
	if got := recovery(rs, end, stop, 30); got != 2 {
		t.Errorf("slow for 2 s: recovery %v, want 2", got)
	}
	// One slow request in a later second does not move a 5-s p99.
	rs = append(rs, at(7.5, slow, true))
	if got := recovery(rs, end, stop, 30); got != 2 {
		t.Errorf("one slow request at 7.5 s: recovery %v, want 2", got)
	}
	rs = append(rs, at(3.5, fast, false))
	if got := recovery(rs, end, stop, 30); got != 4 {
		t.Errorf("a failure at 3.5 s: recovery %v, want 4", got)
	}
	if got := recovery(rs, end, stop, 1); got != -1 {
		t.Errorf("never under 1 ms: recovery %v, want -1", got)
	}
	if got := recovery(rs, end, end.Add(4*time.Second), 30); got != -1 {
		t.Errorf("a 4-s window: recovery %v, want -1 (too short to judge)", got)
	}
}
