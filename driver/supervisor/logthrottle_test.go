package supervisor

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestThrottledLogWritesOneLinePerIntervalAndCountsTheRest(t *testing.T) {
	var out bytes.Buffer
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := newThrottledLog(&out, 5*time.Second)
	l.now = func() time.Time { return now }

	l.logf("renew: %s", "connection refused") // written
	for i := 0; i < 3; i++ {
		now = now.Add(time.Second)
		l.logf("watch: EOF") // held back
	}
	now = now.Add(3 * time.Second)
	l.logf("renew: %s", "no cluster leader") // written, counting 3 held

	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{
		"gpujob: consul: renew: connection refused",
		"gpujob: consul: renew: no cluster leader (and 3 more like it)",
	}
	if len(lines) != len(want) {
		t.Fatalf("got %d lines %q, want %q", len(lines), lines, want)
	}
	for i := range want {
		if lines[i] != want[i] {
			t.Errorf("line %d: got %q, want %q", i, lines[i], want[i])
		}
	}
}
