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
