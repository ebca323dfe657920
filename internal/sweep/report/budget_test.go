package report

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// hugeLine is a metric or result line as large as a line may be that still
// parses: 64 values with 120-byte names, about 10 KiB.
func hugeLine(prefix string, step int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `%s{"step": %d, "steps": %d`, prefix, step, step)
	for i := 0; i < maxValues; i++ {
		fmt.Fprintf(&b, `, "%s%03d": %d.5`, strings.Repeat("v", maxNameLen-8), i, step)
	}
	b.WriteString("}\n")
	return b.String()
}

// A rank that prints huge gpujob-result and gpujob-metric lines in a tight
// loop makes a bounded number of Consul writes, of bounded size: results
// skip the write interval only while their own small budget lasts, and
// every write, urgent or not, spends from the byte budget. What was held
// back is counted in the record.
func TestFloodOfHugeResultLinesMakesBoundedWrites(t *testing.T) {
	count := &writeCounter{}
	c := client(t, count)
	key, _ := trialKeys(t, c)
	r := start(t, c, key)
	w := r.Writer()
	b := DefaultBudget()
	// At least 4 s, and on until the writes have spent the byte budget's
	// burst and the reporter has had two intervals to meet the budget: a
	// loaded machine parses fewer lines a second, and the burst would last
	// a fixed flood through.
	const least, most = 4 * time.Second, 30 * time.Second
	began := time.Now()
	var spent time.Time
	lines := 0
	for {
		if spent.IsZero() && count.bytes.Load() >= int64(b.BurstBytes) {
			spent = time.Now()
		}
		if d := time.Since(began); d >= most || d >= least && !spent.IsZero() && time.Since(spent) >= 2*DefaultInterval {
			break
		}
		lines++
		prefix := "gpujob-result: "
		if lines%2 == 0 {
			prefix = "gpujob-metric: "
		}
		fmt.Fprint(w, hugeLine(prefix, lines))
	}
	flood := time.Since(began)
	writes, bytes := count.writes.Load(), count.bytes.Load()
	// The takeover, the results allowed at once, one per interval of the
	// flood, and one of slack for timing; bytes: the burst, the rate over
	// the flood, and one whole record of slack.
	maxWrites := int64(1 + b.Results + int(flood/DefaultInterval) + 1)
	if spent.IsZero() {
		t.Fatalf("%d huge lines in %s wrote %d KiB: the byte budget's burst (%d KiB) was never spent", lines, flood, bytes>>10, b.BurstBytes>>10)
	}
	maxBytes := int64(b.BurstBytes) + int64(flood.Seconds()*float64(b.BytesPerSecond)) + maxRecordBytes
	t.Logf("%d huge lines in %s: %d writes, %d KiB written (at most %d writes, %d KiB)", lines, flood, writes, bytes>>10, maxWrites, maxBytes>>10)
	if writes > maxWrites {
		t.Errorf("%d writes for %d huge lines in %s, want at most %d", writes, lines, flood, maxWrites)
	}
	if bytes > maxBytes {
		t.Errorf("%d KiB written in %s, want at most %d KiB", bytes>>10, flood, maxBytes>>10)
	}
	if writes < 2 {
		t.Errorf("%d writes: the reporter stopped writing altogether", writes)
	}

	// Nothing is lost that matters: the last result reaches Consul on
	// Close, whatever the budgets say, and the record says what they held
	// back.
	if err := r.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, m := get(t, c, key)
	if n := len(m.Points); n == 0 || m.Points[n-1].Step != lines {
		t.Fatalf("the record's last point after Close: %d points, want the last line's step %d", n, lines)
	}
	rep := m.Reporting
	// A write that Close interrupted may have landed uncounted.
	if all := count.writes.Load(); rep.Points != int64(lines) || rep.Writes > all || rep.Writes < all-1 || rep.ResultsDeferred == 0 || rep.ByteBudgetWaits == 0 {
		t.Errorf("the record's reporting counters %+v for %d lines and %d writes: want every line and write counted, "+
			"and results deferred and writes delayed by the byte budget", rep, lines, all)
	}
}

// An ordinary workload — a metric line per step and one result — never
// meets the budgets: its result is written at once, nothing is counted as
// held back.
func TestOrdinaryReportingMeetsNoBudget(t *testing.T) {
	c := client(t, nil)
	key, _ := trialKeys(t, c)
	r := start(t, c, key)
	w := r.Writer()
	for step := 1; step <= 200; step++ {
		fmt.Fprintf(w, "gpujob-metric: {\"step\": %d, \"loss\": %g, \"accuracy\": %g}\n", step, 1/float64(step), float64(step)/200)
		time.Sleep(5 * time.Millisecond)
	}
	fmt.Fprintf(w, "gpujob-result: {\"accuracy\": 0.97, \"steps\": 200}\n")
	waitFor(t, 500*time.Millisecond, "the result written at once", func() bool {
		_, m := get(t, c, key)
		return len(m.Points) > 0 && m.Points[len(m.Points)-1].Final
	})
	if err := r.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, m := get(t, c, key)
	if rep := m.Reporting; rep.ResultsDeferred != 0 || rep.ByteBudgetWaits != 0 || rep.DroppedLines != 0 || rep.Points != 201 {
		t.Errorf("an ordinary trial's counters: %+v", rep)
	}
}
