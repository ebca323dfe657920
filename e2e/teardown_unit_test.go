package e2e

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// These run without GPUJOB_E2E: they check the bookkeeping that stops the
// shared clusters after their last test.

func TestSelectedByRunAndSkip(t *testing.T) {
	for _, c := range []struct {
		run, skip, name string
		want            bool
	}{
		{"", "", "TestChaos", true},
		{"", "^TestChaos$", "TestChaos", false},
		{"", "^TestChaos$", "TestChaosMonkey", true},
		{"TestFault", "", "TestFaultNodeLost", true},
		{"^TestFaultKill", "", "TestFaultNodeLost", false},
		{"TestA|TestFaultNodeLost", "", "TestFaultNodeLost", true},
		{"TestFaultNodeLost/row", "", "TestFaultNodeLost", true},
		{"", "TestFaultNodeLost/row", "TestFaultNodeLost", true}, // skips a subtest only
		{"[", "", "TestFaultNodeLost", true},                     // go test refuses it; "selected" is the safe error
	} {
		if got := selectedBy(c.run, c.skip, c.name); got != c.want {
			t.Errorf("-run %q -skip %q: %s selected %v, want %v", c.run, c.skip, c.name, got, c.want)
		}
	}
}

// Every test that asks for a shared cluster is among its users, and every
// user is a test that asks for it: a missing user would find its cluster
// stopped by the one before, a stale one would keep it up to the end.
func TestSharedClusterUsersAreTheTestsThatUseThem(t *testing.T) {
	getters := map[string]*sharedCluster{"secureCluster": secure, "dockerCluster": docker, "pairCluster": pair, "haCluster": consulHA}
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	uses := map[*sharedCluster][]string{}
	fset := token.NewFileSet()
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				id, ok := call.Fun.(*ast.Ident)
				if !ok || getters[id.Name] == nil {
					return true
				}
				if !strings.HasPrefix(fn.Name.Name, "Test") {
					t.Errorf("%s calls %s: only a top-level test may (its end is what the cluster counts)", fn.Name.Name, id.Name)
				}
				uses[getters[id.Name]] = append(uses[getters[id.Name]], fn.Name.Name)
				return true
			})
		}
	}
	for _, s := range getters {
		got := slices.Clone(uses[s])
		slices.Sort(got)
		got = slices.Compact(got)
		want := slices.Sorted(slices.Values(s.users))
		if !slices.Equal(got, want) {
			t.Errorf("%s: the tests that use it are %v, its users list %v", s.what, got, want)
		}
	}
}
