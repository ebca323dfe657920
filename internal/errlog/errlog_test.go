package errlog

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestRunThrottlesAndSaysWhenItWorksAgain(t *testing.T) {
	var lines []string
	r := NewRetrying(func(f string, a ...any) { lines = append(lines, fmt.Sprintf(f, a...)) }, "renewing x")
	clock := time.Unix(0, 0)
	r.now = func() time.Time { return clock }
	for i := 0; i < 5; i++ { // a burst: one line
		r.Failed(errors.New("refused"))
		clock = clock.Add(time.Second)
	}
	clock = clock.Add(Every)
	r.Failed(errors.New("refused")) // the next line counts the held ones
	r.OK()
	r.OK() // nothing to end
	want := []string{
		"renewing x: refused (retrying)",
		"renewing x: refused (retrying) (5 failures since the last line)",
		"renewing x: working again after 6 failed attempts",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("lines:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	New(nil, "quiet").Failed(errors.New("x")) // a nil logf logs nothing and does not panic
}

func TestNewNotedSaysWhatHappensMeanwhile(t *testing.T) {
	var lines []string
	r := NewNoted(func(f string, a ...any) { lines = append(lines, fmt.Sprintf(f, a...)) }, "watching y", " (keeping the last good ones)")
	r.Failed(errors.New("EOF"))
	if len(lines) != 1 || lines[0] != "watching y: EOF (keeping the last good ones)" {
		t.Errorf("lines %q", lines)
	}
}

func TestThrottledWritesOneLinePerIntervalAndCountsTheRest(t *testing.T) {
	var lines []string
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := NewThrottled(func(f string, a ...any) { lines = append(lines, fmt.Sprintf(f, a...)) }, 5*time.Second)
	l.now = func() time.Time { return now }

	l.Logf("renew: %s", "connection refused") // written
	for i := 0; i < 3; i++ {
		now = now.Add(time.Second)
		l.Logf("watch: EOF") // held back
	}
	now = now.Add(3 * time.Second)
	l.Logf("renew: %s", "no cluster leader") // written, counting 3 held

	want := []string{
		"renew: connection refused",
		"renew: no cluster leader (and 3 more like it)",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("lines:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	NewThrottled(nil, time.Second).Logf("x") // a nil logf logs nothing and does not panic
}
