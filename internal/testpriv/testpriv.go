// Package testpriv lets tests that need something of the machine (root,
// device nodes, cgroups, an installed command or Python module) skip where
// the machine cannot give it, except where the run must prove it: with
// GPUJOB_REQUIRE_PRIV=1 (CI's .ci/run sets it) such a skip is a failure
// that names what to install, so a suite cannot go green by skipping.
//
// Skips that are opt-in by design stay plain t.Skip: GPUJOB_E2E unset,
// -short, benchmarks and real-GPU (NVML) checks on a machine without one.
package testpriv

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// Env is the variable that turns these skips into failures.
const Env = "GPUJOB_REQUIRE_PRIV"

// TB is the part of testing.TB this package uses.
type TB interface {
	Helper()
	Skip(args ...any)
	Fatal(args ...any)
}

// Required reports whether these skips are failures in this run.
func Required() bool { return os.Getenv(Env) == "1" }

// Skip skips the test for want of something the machine lacks, or fails it
// when Required.
func Skip(t TB, format string, args ...any) {
	t.Helper()
	why := fmt.Sprintf(format, args...)
	if Required() {
		t.Fatal(why + " (" + Env + "=1: this run must have it)")
		return
	}
	t.Skip(why)
}

// NeedRoot skips (or fails, when Required) a test that needs root.
func NeedRoot(t TB, what string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Skip(t, "needs root: %s", what)
	}
}

// NeedCommand returns the path of the command name on PATH; without one it
// skips (or fails, when Required) the test, saying how to install it
// (installHint, e.g. "apt-get install tmux").
func NeedCommand(t TB, name, installHint string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Skip(t, "%s is not installed (%s)", name, installHint)
	}
	return p
}

// NeedPython skips (or fails, when Required) a test unless the interpreter
// python runs and imports every one of modules; installHint says how to
// install what is missing (e.g. "apt-get install python3-optuna").
func NeedPython(t TB, python, installHint string, modules ...string) {
	t.Helper()
	if err := CheckPython(python, modules...); err != nil {
		Skip(t, "%v (%s)", err, installHint)
	}
}

// CheckPython reports why python cannot import modules, or nil when it
// can. It is NeedPython's check, for tests that want to run it once.
func CheckPython(python string, modules ...string) error {
	code := "pass"
	if len(modules) > 0 {
		code = "import " + strings.Join(modules, ", ")
	}
	out, err := exec.Command(python, "-c", code).CombinedOutput()
	if err != nil {
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		return fmt.Errorf("%s -c %q: %v: %s", python, code, err, lines[len(lines)-1])
	}
	return nil
}
