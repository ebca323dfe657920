// Package testpriv lets tests that need privileges (root, device nodes,
// cgroups) skip where the machine cannot give them, except where the run
// must prove them: with GPUJOB_REQUIRE_PRIV=1 (CI's .ci/run sets it) such a
// skip is a failure, so a suite cannot go green by skipping its isolation
// tests.
package testpriv

import (
	"fmt"
	"os"
)

// Env is the variable that turns privilege skips into failures.
const Env = "GPUJOB_REQUIRE_PRIV"

// TB is the part of testing.TB this package uses.
type TB interface {
	Helper()
	Skip(args ...any)
	Fatal(args ...any)
}

// Required reports whether privilege skips are failures in this run.
func Required() bool { return os.Getenv(Env) == "1" }

// Skip skips the test for want of a privilege the machine lacks, or fails
// it when Required.
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
