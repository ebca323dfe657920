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
var known = []Edge{
	// The sweep controller's Consul session comes from the rendezvous;
	// internal/consul replaces it (issue 24).
	{"internal/sweep/controller", "driver/rendezvous"},
}

// TestModuleImports checks this module's import graph (its packages and
// their dependencies, tests excluded) against the rules.
func TestModuleImports(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "-json=ImportPath,Imports", "./...")
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
	seen := map[Edge]bool{}
	for _, v := range Check(pkgs) {
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
