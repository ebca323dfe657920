// Command testtimes reads `go test -json` output and says where the time
// went: the N slowest tests and every skipped test with its reason. .ci/run
// prints it at the end of a run, passed or failed.
//
//	testtimes [-n 15] [file ...]   (standard input without files)
//	go test -json ... | tee out.json | testtimes -echo [-v]
//
// With -echo it prints the stream as go test (-v) would have instead, for
// the make targets that keep the JSON (TEST_JSON) and show the text.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
)

func main() {
	n := flag.Int("n", 15, "how many of the slowest tests to print")
	echo := flag.Bool("echo", false, "print the stream as go test would instead of the summary")
	verbose := flag.Bool("v", false, "with -echo: as go test -v would")
	flag.Parse()
	if *echo {
		if err := Echo(os.Stdout, os.Stdin, *verbose); err != nil {
			fmt.Fprintln(os.Stderr, "testtimes:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(os.Stdout, os.Stdin, flag.Args(), *n); err != nil {
		fmt.Fprintln(os.Stderr, "testtimes:", err)
		os.Exit(1)
	}
}

func run(w io.Writer, stdin io.Reader, files []string, n int) error {
	var s Summary
	if len(files) == 0 {
		if err := s.Read(stdin); err != nil {
			return fmt.Errorf("reading standard input: %w", err)
		}
	}
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return fmt.Errorf("opening the test output: %w", err)
		}
		err = s.Read(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("reading %s: %w", name, err)
		}
	}
	return s.Print(w, n)
}
