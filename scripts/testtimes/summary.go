package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64 // seconds, on pass, fail and skip
	Output  string
}

// Result is one test's end: its package and name, how it ended and how long
// it took; Reason is a skipped test's t.Skip message.
type Result struct {
	Package, Test string
	Action        string // pass, fail or skip
	// Elapsed is the test's own time: go test's, less Waited.
	Elapsed time.Duration
	// Waited is how long an e2e test waited in line for a lane and its
	// cluster (e2e/lanes_test.go), which go test counts in its time.
	Waited time.Duration
	Reason string
}

// waitMarker starts the line an e2e test logs when it gets its cluster,
// followed by JSON (e2e/lanes_test.go: waitMarker, waitRecord).
const waitMarker = "gpujob-e2e-wait:"

// waited reads the wait out of a line of a test's output, if it is the
// marker's.
func waited(line string) (time.Duration, bool) {
	_, rec, ok := strings.Cut(line, waitMarker+" ")
	if !ok {
		return 0, false
	}
	var w struct {
		WaitedS float64 `json:"waited_s"`
	}
	if json.Unmarshal([]byte(strings.TrimSpace(rec)), &w) != nil || w.WaitedS < 0 {
		return 0, false
	}
	return time.Duration(w.WaitedS * float64(time.Second)), true
}

// Summary gathers the results of one or more `go test -json` streams.
type Summary struct {
	Results []Result
	// output keeps each running test's output lines until it ends: a
	// skipped test's reason is among them.
	output map[string][]string
}

// Read adds the results of one stream. Lines that are not JSON (a build
// failure's output, a tee'd banner) are ignored: the summary is about the
// tests that ran.
func (s *Summary) Read(r io.Reader) error {
	if s.output == nil {
		s.output = map[string][]string{}
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 || line[0] != '{' {
			continue
		}
		var e event
		if json.Unmarshal(line, &e) != nil || e.Test == "" {
			continue
		}
		key := e.Package + "\x00" + e.Test
		switch e.Action {
		case "output":
			s.output[key] = append(s.output[key], e.Output)
		case "pass", "fail", "skip":
			res := Result{Package: e.Package, Test: e.Test, Action: e.Action,
				Elapsed: time.Duration(e.Elapsed * float64(time.Second))}
			for _, l := range s.output[key] {
				if d, ok := waited(l); ok {
					res.Waited += d
				}
			}
			res.Elapsed = max(res.Elapsed-res.Waited, 0)
			if e.Action == "skip" {
				res.Reason = skipReason(s.output[key])
			}
			delete(s.output, key)
			s.Results = append(s.Results, res)
		}
	}
	return sc.Err()
}

// skipReason picks a skipped test's message out of its output: the lines
// between "=== RUN" and "--- SKIP" that t.Skip printed ("    file.go:12:
// why"), the file and line dropped.
func skipReason(lines []string) string {
	var why []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if _, marker := waited(t); t == "" || marker || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- ") {
			continue
		}
		if file, rest, ok := strings.Cut(t, ": "); ok && strings.Contains(file, ".go:") {
			t = rest
		}
		why = append(why, t)
	}
	if len(why) == 0 {
		return "(no reason given)"
	}
	return strings.Join(why, " / ")
}

// Print writes the n slowest tests (top-level tests only: a subtest's time
// is inside its parent's) and every skipped test, subtests included.
func (s *Summary) Print(w io.Writer, n int) error {
	var top, skipped []Result
	var total time.Duration
	for _, r := range s.Results {
		if !strings.Contains(r.Test, "/") {
			top = append(top, r)
			total += r.Elapsed
		}
		if r.Action == "skip" {
			skipped = append(skipped, r)
		}
	}
	sort.SliceStable(top, func(i, j int) bool { return top[i].Elapsed > top[j].Elapsed })
	n = min(n, len(top))
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "==> the %d slowest of %d tests (%s, summed):\n", n, len(top), total.Round(time.Second))
	for _, r := range top[:n] {
		fmt.Fprintf(bw, "  %8.1fs  %-4s  %s %s", r.Elapsed.Seconds(), r.Action, shortPackage(r.Package), r.Test)
		if r.Waited >= time.Second/10 {
			fmt.Fprintf(bw, " (after %.1fs in line for a lane)", r.Waited.Seconds())
		}
		fmt.Fprintln(bw)
	}
	fmt.Fprintf(bw, "==> %d skipped tests:\n", len(skipped))
	for _, r := range skipped {
		fmt.Fprintf(bw, "  %s %s: %s\n", shortPackage(r.Package), r.Test, r.Reason)
	}
	return bw.Flush()
}

// shortPackage drops the module path the packages share.
func shortPackage(p string) string {
	return strings.TrimPrefix(p, "github.com/gpujob/gpujob/")
}
