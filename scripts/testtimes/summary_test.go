package main

import (
	"bytes"
	"strings"
	"testing"
)

// stream is a `go test -json` run of two packages: a slow and a fast test, a
// failed one, a skipped test and a skipped subtest, a build-failure line and
// a banner that are not JSON.
const stream = `==> make unit
{"Action":"start","Package":"github.com/gpujob/gpujob/e2e"}
{"Action":"run","Package":"github.com/gpujob/gpujob/e2e","Test":"TestSlow"}
{"Action":"output","Package":"github.com/gpujob/gpujob/e2e","Test":"TestSlow","Output":"=== RUN   TestSlow\n"}
{"Action":"output","Package":"github.com/gpujob/gpujob/e2e","Test":"TestSlow","Output":"--- PASS: TestSlow (92.50s)\n"}
{"Action":"pass","Package":"github.com/gpujob/gpujob/e2e","Test":"TestSlow","Elapsed":92.5}
{"Action":"run","Package":"github.com/gpujob/gpujob/e2e","Test":"TestSkipped"}
{"Action":"output","Package":"github.com/gpujob/gpujob/e2e","Test":"TestSkipped","Output":"=== RUN   TestSkipped\n"}
{"Action":"output","Package":"github.com/gpujob/gpujob/e2e","Test":"TestSkipped","Output":"    identity_test.go:82: the dev cluster's client is not root\n"}
{"Action":"output","Package":"github.com/gpujob/gpujob/e2e","Test":"TestSkipped","Output":"--- SKIP: TestSkipped (0.00s)\n"}
{"Action":"skip","Package":"github.com/gpujob/gpujob/e2e","Test":"TestSkipped","Elapsed":0}
{"Action":"run","Package":"github.com/gpujob/gpujob/e2e","Test":"TestParent"}
{"Action":"run","Package":"github.com/gpujob/gpujob/e2e","Test":"TestParent/row"}
{"Action":"output","Package":"github.com/gpujob/gpujob/e2e","Test":"TestParent/row","Output":"    faults_test.go:9: -short\n"}
{"Action":"skip","Package":"github.com/gpujob/gpujob/e2e","Test":"TestParent/row","Elapsed":0}
{"Action":"pass","Package":"github.com/gpujob/gpujob/e2e","Test":"TestParent","Elapsed":300.25}
# github.com/gpujob/gpujob/broken [build failed]
{"Action":"pass","Package":"github.com/gpujob/gpujob/e2e","Elapsed":400}
{"Action":"run","Package":"github.com/gpujob/gpujob/driver","Test":"TestFast"}
{"Action":"pass","Package":"github.com/gpujob/gpujob/driver","Test":"TestFast","Elapsed":0.01}
{"Action":"fail","Package":"github.com/gpujob/gpujob/driver","Test":"TestFailed","Elapsed":12}
`

func TestSummary(t *testing.T) {
	var s Summary
	if err := s.Read(strings.NewReader(stream)); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := s.Print(&out, 2); err != nil {
		t.Fatal(err)
	}
	want := `==> the 2 slowest of 5 tests (6m45s, summed):
     300.2s  pass  e2e TestParent
      92.5s  pass  e2e TestSlow
==> 2 skipped tests:
  e2e TestSkipped: the dev cluster's client is not root
  e2e TestParent/row: -short
`
	if out.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", out.String(), want)
	}
}

// More tests asked for than ran: all of them, slowest first, the failed one
// among them.
func TestSummaryFewerTestsThanAsked(t *testing.T) {
	var s Summary
	if err := s.Read(strings.NewReader(stream)); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := s.Print(&out, 15); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if lines[0] != "==> the 5 slowest of 5 tests (6m45s, summed):" || !strings.Contains(lines[3], "fail  driver TestFailed") ||
		!strings.HasSuffix(lines[4], "driver TestFast") {
		t.Errorf("got:\n%s", out.String())
	}
}

func TestSkipReasonWithoutMessage(t *testing.T) {
	if got := skipReason([]string{"=== RUN   TestX\n", "--- SKIP: TestX (0.00s)\n"}); got != "(no reason given)" {
		t.Errorf("got %q", got)
	}
}

// An e2e test in lanes waited in line before it ran: the wait comes out of
// its time (and its order among the slowest) and is shown beside it; a test
// skipped after its wait keeps its reason without the marker.
func TestSummaryTakesOutTheWaitInLine(t *testing.T) {
	const lanes = `{"Action":"run","Package":"github.com/gpujob/gpujob/e2e","Test":"TestWaited"}
{"Action":"output","Package":"github.com/gpujob/gpujob/e2e","Test":"TestWaited","Output":"    lanes_test.go:170: gpujob-e2e-wait: {\"cluster\":\"dev cluster 1\",\"waited_s\":300.5}\n"}
{"Action":"pass","Package":"github.com/gpujob/gpujob/e2e","Test":"TestWaited","Elapsed":340.5}
{"Action":"run","Package":"github.com/gpujob/gpujob/e2e","Test":"TestFirst"}
{"Action":"output","Package":"github.com/gpujob/gpujob/e2e","Test":"TestFirst","Output":"    lanes_test.go:170: gpujob-e2e-wait: {\"cluster\":\"dev cluster 0\",\"waited_s\":0.001}\n"}
{"Action":"pass","Package":"github.com/gpujob/gpujob/e2e","Test":"TestFirst","Elapsed":60}
{"Action":"run","Package":"github.com/gpujob/gpujob/e2e","Test":"TestNotRoot"}
{"Action":"output","Package":"github.com/gpujob/gpujob/e2e","Test":"TestNotRoot","Output":"    lanes_test.go:170: gpujob-e2e-wait: {\"cluster\":\"dev cluster 0\",\"waited_s\":20}\n"}
{"Action":"output","Package":"github.com/gpujob/gpujob/e2e","Test":"TestNotRoot","Output":"    isolation_test.go:48: not root\n"}
{"Action":"skip","Package":"github.com/gpujob/gpujob/e2e","Test":"TestNotRoot","Elapsed":20}
`
	var s Summary
	if err := s.Read(strings.NewReader(lanes)); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := s.Print(&out, 2); err != nil {
		t.Fatal(err)
	}
	want := `==> the 2 slowest of 3 tests (1m40s, summed):
      60.0s  pass  e2e TestFirst
      40.0s  pass  e2e TestWaited (after 300.5s in line for a lane)
==> 1 skipped tests:
  e2e TestNotRoot: not root
`
	if out.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", out.String(), want)
	}
}
