// Package importrules states which of gpujob's packages may import which,
// and checks a module's import graph (what `go list -deps -json` prints)
// against the rules. Its test runs the check on this module in `make lint`.
//
// The rules keep the layers apart: the libraries under internal/ are
// shared by the CLI, the driver and the controllers, so they import
// neither; a command folder only parses and prints, so commands share code
// through libraries, never through each other; and a library never
// reaches up into a command.
package importrules

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
)

// Module is the module the rules are about.
const Module = "github.com/gpujob/gpujob"

// Package is the part of `go list -json` output the rules read.
type Package struct {
	ImportPath string
	Imports    []string
	// TestImports and XTestImports are the imports of the package's tests
	// (go list without -deps); CheckTests judges them.
	TestImports, XTestImports []string
}

// Edge is one import: From imports To (paths relative to Module).
type Edge struct{ From, To string }

func (e Edge) String() string { return e.From + " → " + e.To }

// Violation is an edge and the rule it breaks.
type Violation struct {
	Edge
	Rule string
}

// Decode reads the stream of JSON objects `go list -json` prints.
func Decode(r io.Reader) ([]Package, error) {
	var out []Package
	dec := json.NewDecoder(r)
	for {
		var p Package
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, fmt.Errorf("decode go list output: %w", err)
		}
		out = append(out, p)
	}
}

// Check returns the module's imports that break a rule, sorted. Packages
// outside Module, and imports of packages outside it, are not judged.
func Check(pkgs []Package) []Violation {
	var out []Violation
	for _, p := range pkgs {
		from, ok := local(p.ImportPath)
		if !ok {
			continue
		}
		for _, imp := range p.Imports {
			to, ok := local(imp)
			if !ok {
				continue
			}
			if rule := broken(from, to); rule != "" {
				out = append(out, Violation{Edge{from, to}, rule})
			}
		}
	}
	sort.Slice(out, func(i, k int) bool {
		if out[i].From != out[k].From {
			return out[i].From < out[k].From
		}
		return out[i].To < out[k].To
	})
	return out
}

// CheckTests returns the imports of the module's tests that break a rule.
// A test may also import its own package and cli/command/root (to drive
// the whole CLI as a user does).
func CheckTests(pkgs []Package) []Violation {
	var asPkgs []Package
	for _, p := range pkgs {
		var imps []string
		for _, imp := range append(slices.Clone(p.TestImports), p.XTestImports...) {
			if imp != p.ImportPath && imp != Module+"/cli/command/root" {
				imps = append(imps, imp)
			}
		}
		asPkgs = append(asPkgs, Package{ImportPath: p.ImportPath, Imports: imps})
	}
	return Check(asPkgs)
}

// broken names the rule from → to breaks, "" when none.
func broken(from, to string) string {
	switch {
	case under(from, "internal") && (under(to, "driver") || under(to, "cli")):
		return "internal/ imports neither driver/ nor cli/"
	case under(from, "cli/command"):
		if from == "cli/command/root" || !under(to, "cli/command") {
			return ""
		}
		if command(from) != command(to) {
			return "a command imports no other command (share code through a library; only cli/command/root wires commands)"
		}
	case under(to, "cli/command"):
		if under(from, "cli/cmd") && to == "cli/command/root" {
			return ""
		}
		return "a library never imports a command (only cli/cmd's mains import cli/command/root)"
	}
	return ""
}

// command is X of cli/command/X[/...].
func command(path string) string {
	rest := strings.TrimPrefix(path, "cli/command/")
	name, _, _ := strings.Cut(rest, "/")
	return name
}

func local(path string) (string, bool) {
	rest, ok := strings.CutPrefix(path, Module+"/")
	return rest, ok
}

func under(path, dir string) bool { return path == dir || strings.HasPrefix(path, dir+"/") }
