package admit

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// Latencies land in the bucket of the first bound at least as long
// (Prometheus' le), out-of-range ones are clamped, and the cumulative
// counts are what a Prometheus histogram carries.
func TestStatsAdmittedBuckets(t *testing.T) {
	s := NewStats()
	q := s.Queue("team-a")
	q.Admitted(1, 0)                     // ≤ 1 s
	q.Admitted(1, time.Second)           // ≤ 1 s: le is inclusive
	q.Admitted(1, 1500*time.Millisecond) // ≤ 5 s
	q.Admitted(2, 20*time.Minute)        // ≤ 1800 s, twice
	q.Admitted(1, -time.Hour)            // a clock step back: 0
	q.Admitted(1, 48*time.Hour)          // beyond a day: +Inf
	q.Admitted(1, 10*366*24*time.Hour)   // clamped to MaxLatency
	q.Admitted(0, time.Hour)             // nothing
	q.Admitted(-3, time.Hour)            // nothing
	if q.Admissions != 8 {
		t.Fatalf("admissions %d, want 8", q.Admissions)
	}
	cum := q.Cumulative()
	for le, want := range map[float64]uint64{1: 3, 5: 4, 900: 4, 1800: 6, 86400: 6} {
		if cum[le] != want {
			t.Errorf("le %g: %d, want %d (all: %v)", le, cum[le], want, cum)
		}
	}
	if got := q.LatencyCounts[len(q.LatencyCounts)-1]; got != 2 {
		t.Errorf("+Inf bucket %d, want 2", got)
	}
	wantSum := 1 + 1.5 + 2*1200 + 48*3600 + MaxLatency.Seconds()
	if q.LatencySumS != wantSum {
		t.Errorf("sum %g, want %g", q.LatencySumS, wantSum)
	}
	if err := s.Check(); err != nil {
		t.Fatalf("a record built by the methods fails Check: %v", err)
	}
	b, err := EncodeStats(s)
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodeStats(b)
	if err != nil || back.Queues["team-a"].Admissions != 8 {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
}

// A stats record is read as strictly as every record of the queue tree:
// another format, unknown fields, bad names, inconsistent or impossible
// numbers are refused.
func TestDecodeStatsRefuses(t *testing.T) {
	zeros := `[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0]`
	one := `[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,1]`
	qs := func(body string) string { return `{"format":1,"queues":{` + body + `}}` }
	entry := func(name, admissions, counts, sum string) string {
		return fmt.Sprintf(`"%s":{"admissions":%s,"preemptions":0,"refusals":0,"latency_counts":%s,"latency_sum_s":%s}`, name, admissions, counts, sum)
	}
	for _, tc := range []struct {
		name, value, want string
	}{
		{"ok", qs(entry("team-a", "1", one, "100000")), ""},
		{"ok undeclared", qs(entry(UndeclaredQueue, "0", zeros, "0")), ""},
		{"ok empty", qs(""), ""},
		{"format", `{"format":2,"queues":{}}`, "format 2"},
		{"no queues", `{"format":1}`, "no queues"},
		{"null queues", `{"format":1,"queues":null}`, "no queues"},
		{"unknown field", `{"format":1,"queues":{},"extra":1}`, "unknown field"},
		{"unknown nested field", qs(`"a":{"admissions":0,"latency_counts":` + zeros + `,"latency_sum_s":0,"x":1}`), "unknown field"},
		{"trailing", qs("") + `{}`, "more after"},
		{"null queue", qs(`"a":null`), "null"},
		{"bad name", qs(entry("-x", "0", zeros, "0")), "not a queue name"},
		{"escape in name", qs(entry(`a\u001b[2J`, "0", zeros, "0")), "not a queue name"},
		{"too long name", qs(entry(strings.Repeat("a", 64), "0", zeros, "0")), "not a queue name"},
		{"buckets", qs(entry("a", "0", `[0,0]`, "0")), "latency buckets"},
		{"counts and admissions disagree", qs(entry("a", "2", one, "1")), "add up to 1"},
		{"overflow", qs(entry("a", "1", `[18446744073709551615,2,0,0,0,0,0,0,0,0,0,0,0,0,0,0]`, "0")), "overflow"},
		{"negative count", qs(entry("a", "-1", zeros, "0")), "cannot unmarshal"},
		{"negative sum", qs(entry("a", "1", one, "-1")), "latency sum"},
		{"sum beyond the bound", qs(entry("a", "1", one, "1e12")), "latency sum"},
		{"not JSON", `format=1`, "not a queue stats record"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := DecodeStats([]byte(tc.value))
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if _, err := EncodeStats(s); err != nil {
					t.Fatalf("decoded but not encodable: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("DecodeStats = %+v, %v; want an error with %q", s, err, tc.want)
			}
		})
	}
	// More queues than a configuration can declare.
	s := NewStats()
	for i := range 1002 {
		s.Queue(fmt.Sprintf("q%d", i))
	}
	if _, err := EncodeStats(s); err == nil || !strings.Contains(err.Error(), "1002 queues") {
		t.Errorf("1002 queues: %v", err)
	}
	if _, err := DecodeStats([]byte(`{"format":1,"queues":{"a":` + strings.Repeat(" ", MaxRecordBytes) + `}}`)); err == nil || !strings.Contains(err.Error(), "at most") {
		t.Errorf("a record over the size limit: %v", err)
	}
}

// Keep drops removed queues but never the undeclared entry; Clone is deep.
func TestStatsKeepAndClone(t *testing.T) {
	s := NewStats()
	s.Queue("a").Admitted(1, time.Second)
	s.Queue("gone").Refusals++
	s.Queue(UndeclaredQueue).Refusals++
	c := s.Clone()
	c.Keep(func(q string) bool { return q == "a" })
	c.Queue("a").Admitted(1, time.Minute)
	if _, ok := c.Queues["gone"]; ok {
		t.Error("a removed queue kept")
	}
	if _, ok := c.Queues[UndeclaredQueue]; !ok {
		t.Error("the undeclared entry dropped")
	}
	if s.Queues["a"].Admissions != 1 || s.Queues["a"].LatencyCounts[4] != 0 || len(s.Queues) != 3 {
		t.Errorf("the clone shares state with the original: %+v", s.Queues["a"])
	}
}
