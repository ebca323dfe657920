// Command gpujob-docs writes the generated references of docs/: the CLI
// reference (docs/reference/cli/, cobra's doc generator over the gpujob
// command tree) and the spec reference (docs/reference/specs.md, from the
// spec parser's schemas). With -check it writes nothing: it fails listing
// the generated files that are stale and every relative link or #anchor of
// README.md and docs/ that does not resolve.
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	root := flag.String("root", ".", "the repository's root directory")
	check := flag.Bool("check", false, "only check that the generated files are current and every link resolves")
	flag.Parse()

	// Flag defaults read from the environment (NOMAD_NAMESPACE, the key
	// prefixes, …) would write this shell's settings into the reference:
	// the command tree is built with none.
	os.Clearenv()

	files, err := Generate()
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpujob-docs:", err)
		os.Exit(1)
	}
	if !*check {
		if err := Write(*root, files); err != nil {
			fmt.Fprintln(os.Stderr, "gpujob-docs:", err)
			os.Exit(1)
		}
		return
	}
	var problems []string
	stale, err := Stale(*root, files)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpujob-docs:", err)
		os.Exit(1)
	}
	for _, s := range stale {
		problems = append(problems, s+": stale (run make docs)")
	}
	broken, err := CheckLinks(os.DirFS(*root))
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpujob-docs:", err)
		os.Exit(1)
	}
	problems = append(problems, broken...)
	for _, p := range problems {
		fmt.Fprintln(os.Stderr, p)
	}
	if len(problems) > 0 {
		fmt.Fprintf(os.Stderr, "gpujob-docs: %d problem(s)\n", len(problems))
		os.Exit(1)
	}
}
