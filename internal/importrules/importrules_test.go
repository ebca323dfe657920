package importrules

import (
	"bytes"
	"os/exec"
	"slices"
	"testing"
)

// known are the violations the module still has, each with the change that
// removes it. An entry that no longer matches a violation fails the test,
// so the list only shrinks.
var known = []Edge{}

// knownInTests are the violations of the module's tests.
var knownInTests = []Edge{}

// goList runs go list with args in the module's root.
func goList(t *testing.T, args ...string) []Package {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = "../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	pkgs, err := Decode(bytes.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	mine := 0
	for _, p := range pkgs {
		if _, ok := local(p.ImportPath); ok {
			mine++
		}
	}
	if mine < 20 {
		t.Fatalf("go list listed %d of the module's packages: the check would check nothing", mine)
	}
	return pkgs
}

// compare fails the test for each violation not in known and each entry
// of known that is no longer a violation.
func compare(t *testing.T, got []Violation, known []Edge) {
	t.Helper()
	seen := map[Edge]bool{}
	for _, v := range got {
		seen[v.Edge] = true
		if !slices.Contains(known, v.Edge) {
			t.Errorf("%s: %s", v.Edge, v.Rule)
		}
	}
	for _, e := range known {
		if !seen[e] {
			t.Errorf("%s is no longer imported: delete it from the known violations", e)
		}
	}
}

// TestTestImports checks the imports of the module's tests.
func TestTestImports(t *testing.T) {
	compare(t, CheckTests(goList(t, "-json=ImportPath,TestImports,XTestImports", "./...")), knownInTests)
}

// TestModuleImports checks this module's import graph (its packages and
// their dependencies, tests excluded) against the rules.
func TestModuleImports(t *testing.T) {
	compare(t, Check(goList(t, "-deps", "-json=ImportPath,Imports", "./...")), known)
}

func TestRules(t *testing.T) {
	const m = Module + "/"
	for _, tc := range []struct {
		from, to string
		broken   bool
	}{
		{"internal/servekv", "internal/contract", false},
		{"internal/sweep/controller", "driver/rendezvous", true},
		{"internal/gateway", "cli/render", true},
		{"driver", "internal/contract", false},
		{"cli/command/service", "cli/command/submit", true},
		{"cli/command/service", "cli/servestore", false},
		{"cli/command/gpujobs2", "cli/command/gpujobs2/fixture", false}, // a command's own subpackage
		{"cli/command/root", "cli/command/submit", false},
		{"cli/cmd/gpujob", "cli/command/root", false},
		{"cli/cmd/gpujob", "cli/command/submit", true},
		{"cli/observe", "cli/command/gpujobs", true},
		{"cli/observe", "cli/gpujobs", false},
		{"driver", "cli/command/root", true},
	} {
		got := Check([]Package{{ImportPath: m + tc.from, Imports: []string{m + tc.to, "fmt", "github.com/other/x"}}})
		if (len(got) > 0) != tc.broken {
			t.Errorf("%s → %s: violations %v, want broken=%v", tc.from, tc.to, got, tc.broken)
		}
	}
}

func TestTestRules(t *testing.T) {
	const m = Module + "/"
	pkgs := []Package{
		{ImportPath: m + "cli/command/acl", XTestImports: []string{m + "cli/command/acl", m + "cli/command/root"}},
		{ImportPath: m + "cli/command/top", TestImports: []string{m + "cli/command/service"}},
		{ImportPath: m + "internal/gateway", TestImports: []string{m + "cli/servestore"}},
	}
	got := CheckTests(pkgs)
	want := []Edge{{"cli/command/top", "cli/command/service"}, {"internal/gateway", "cli/servestore"}}
	if len(got) != len(want) {
		t.Fatalf("violations %v, want %v", got, want)
	}
	for i := range want {
		if got[i].Edge != want[i] {
			t.Errorf("violation %d: %s, want %s", i, got[i].Edge, want[i])
		}
	}
}
