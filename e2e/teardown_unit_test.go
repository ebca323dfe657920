package e2e

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
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

// stopAll stops the set's clusters, then kills and reports a process that
// still works for one of them (here a stand-in agent whose command line
// names the cluster's directory), and closes the set.
func TestStopAllKillsAndReportsSurvivors(t *testing.T) {
	dir, err := os.MkdirTemp("", "gj-e2e-unit-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	agent := exec.Command("bash", "-c", `exec -a "$0/dev/agent" sleep 60`, dir)
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = agent.Process.Kill() })
	exited := make(chan error, 1)
	go func() { exited <- agent.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for len(survivors([]string{dir})) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the stand-in agent never showed up among the survivors")
		}
		time.Sleep(20 * time.Millisecond)
	}

	s := newClusterSet()
	s.clusters = []*cluster{{dir: filepath.Join(dir, "dev"), repo: repoRoot()}} // dev-down: nothing to stop
	err = s.stopAll("the test is over")
	if err == nil || !strings.Contains(err.Error(), "outlived their stop") ||
		!strings.Contains(err.Error(), fmt.Sprintf("pid %d ", agent.Process.Pid)) {
		t.Errorf("stopAll: %v, want the survivor pid %d reported", err, agent.Process.Pid)
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Error("the survivor still runs after stopAll")
	}
	if c := s.start(clusterOptions{}); c.failed != "the test is over" {
		t.Errorf("a cluster started after stopAll: failed %q", c.failed)
	}
	if err := s.stopAll("again"); err != nil {
		t.Errorf("a second stopAll: %v", err)
	}
}
