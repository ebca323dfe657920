package main

import (
	"bufio"
	"encoding/json"
	"io"
	"strings"
)

// Echo turns a `go test -json` stream back into the text go test prints, so
// a make target can keep the JSON for testtimes and still show a person
// what go test would have: with verbose, every line (go test -v); without,
// the package lines, build failures and the output of failed tests only
// (plain go test). Lines that are not JSON pass through.
func Echo(w io.Writer, r io.Reader, verbose bool) error {
	bw := bufio.NewWriter(w)
	defer bw.Flush()
	held := map[string][]string{} // a test's output until it passes or fails
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		var e event
		if !strings.HasPrefix(line, "{") || json.Unmarshal([]byte(line), &e) != nil {
			bw.WriteString(line + "\n")
			bw.Flush()
			continue
		}
		key := e.Package + "\x00" + e.Test
		switch {
		case e.Action == "build-output":
			bw.WriteString(e.Output)
		case e.Action != "output" && e.Test != "" && !verbose:
			if e.Action == "fail" {
				for _, l := range held[key] {
					bw.WriteString(l)
				}
			}
			if e.Action == "pass" || e.Action == "fail" || e.Action == "skip" {
				delete(held, key)
			}
		case e.Action != "output":
		case verbose:
			bw.WriteString(e.Output)
		case e.Test == "":
			// The test binary's own "PASS" is go test -v's; plain go
			// test shows the "ok" line alone.
			if e.Output != "PASS\n" {
				bw.WriteString(e.Output)
			}
		default:
			held[key] = append(held[key], e.Output)
		}
		// A line at a time: someone is watching a long run.
		if err := bw.Flush(); err != nil {
			return err
		}
	}
	return sc.Err()
}
