package e2e

import (
	"bytes"
	"context"
	"errors"
	"flag"
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

func TestTeardownMargin(t *testing.T) {
	for _, c := range []struct{ timeout, want time.Duration }{
		{30 * time.Minute, 2 * time.Minute},
		{20 * time.Minute, 2 * time.Minute},
		{10 * time.Minute, time.Minute},
		{10 * time.Second, time.Second},
	} {
		if got := teardownMargin(c.timeout); got != c.want {
			t.Errorf("teardownMargin(%s) = %s, want %s", c.timeout, got, c.want)
		}
	}
}

// teardownFixtureEnv makes the test binary a fixture of
// TestTeardownBeforeTimeout: TestMain runs teardownFixture on the dev state
// dir the variable names instead of starting a cluster.
const teardownFixtureEnv = "GPUJOB_E2E_TEARDOWN_FIXTURE"

// The fixture runs under a -timeout of fixtureTimeout and stops its cluster
// fixtureMargin before it: a second into the run, which leaves the stop
// (dev-down, then the survivor check) 14 s before go test's panic — four
// were too few beside the unit tests and two lanes of e2e tests on two
// cores — and the whole test takes the timeout's 15 s, beside the others
// (it is a parallel test).
const (
	fixtureTimeout = 15 * time.Second
	fixtureMargin  = 14 * time.Second
)

// teardownFixture is TestMain as the e2e run's, but with the cluster in dir
// (made by TestTeardownBeforeTimeout) taken as one this run started, and
// with fixtureMargin. Its only test hangs, so the run ends in go test's
// timeout panic.
func teardownFixture(m *testing.M, dir string) int {
	flag.Parse() // for -timeout
	running.mu.Lock()
	running.clusters = append(running.clusters, &cluster{dir: dir, repo: repoRoot()})
	running.mu.Unlock()
	stop := watchForTeardown(testTimeout(), fixtureMargin)
	defer stop()
	return m.Run()
}

// A run that reaches go test's -timeout stops its clusters before the
// timeout's panic ends the process, and no process of theirs outlives it:
// the test binary runs as a fixture (teardownFixture) whose cluster is a
// dev state dir with a stand-in agent in its PID files, under a -timeout of
// seconds, and hangs in its test.
func TestTeardownBeforeTimeout(t *testing.T) {
	if os.Getenv(teardownFixtureEnv) != "" {
		// The fixture's hung test: it never returns, as an e2e test stuck
		// on a cluster would, so only the timeout ends the run.
		select {}
	}
	// It waits on its fixture's timeout, using no cluster and little
	// CPU: the lanes run meanwhile.
	t.Parallel()
	parent := t.TempDir()
	dir := filepath.Join(parent, "dev")
	for _, d := range []string{filepath.Join(dir, "pids"), filepath.Join(dir, "config")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// dev-down touches only a dir with dev-up's marker.
	if err := os.WriteFile(filepath.Join(dir, ".gpujob-dev"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// A stand-in Consul agent: dev-down trusts a PID file only for a
	// process whose command line names the state dir, as the agents' do.
	agent := exec.Command("sleep", "60")
	agent.Args[0] = filepath.Join(dir, "config", "consul")
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = agent.Process.Kill() })
	exited := make(chan error, 1)
	go func() { exited <- agent.Wait() }()
	if err := os.WriteFile(filepath.Join(dir, "pids", "consul.pid"), []byte(fmt.Sprintf("%d\n", agent.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}

	// A bound far past the fixture's own timeout, for a fixture that
	// hangs instead of panicking.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fixture := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestTeardownBeforeTimeout$", "-test.timeout="+fixtureTimeout.String())
	fixture.Env = append(os.Environ(), teardownFixtureEnv+"="+dir)
	var out bytes.Buffer
	fixture.Stdout, fixture.Stderr = &out, &out // one pipe: the order of the lines holds
	start := time.Now()
	err := fixture.Run()
	took := time.Since(start)
	defer func() {
		// Its goroutine dump only when the test failed.
		text, _, _ := strings.Cut(out.String(), "\ngoroutine ")
		if t.Failed() {
			text = out.String()
		}
		t.Logf("the fixture ran %s:\n%s", took.Round(time.Millisecond), text)
	}()
	if ctx.Err() != nil {
		t.Fatalf("the fixture was still running after %s, past its -timeout of %s", took, fixtureTimeout)
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("the fixture: %v, want it to fail on its timeout", err)
	}

	// In this order: the deadline, the cluster stopped, the stop checked,
	// and only then go test's panic.
	text := out.String()
	at := 0
	for _, want := range []string{
		"e2e: the -timeout deadline is near: stopping the dev clusters",
		"e2e: stopped the cluster in " + dir,
		"e2e: the dev clusters are stopped",
		"panic: test timed out after " + fixtureTimeout.String(),
	} {
		i := strings.Index(text[at:], want)
		if i < 0 {
			t.Fatalf("the fixture's output has no %q after byte %d (see its output above)", want, at)
		}
		at += i + len(want)
	}
	if strings.Contains(text, "outlived their stop") {
		t.Error("dev-down left the stand-in agent for the survivor check to kill")
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Error("the stand-in agent still runs after the fixture's teardown")
	}
	if left := survivors([]string{parent}); len(left) > 0 {
		t.Errorf("processes of the fixture's cluster outlived it: %v", left)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the cluster's state dir is still there after its stop (%v)", err)
	}
}
