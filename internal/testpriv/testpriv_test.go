package testpriv

import (
	"strings"
	"testing"
)

type recorder struct {
	skipped, failed string
}

func (r *recorder) Helper()           {}
func (r *recorder) Skip(args ...any)  { r.skipped = args[0].(string) }
func (r *recorder) Fatal(args ...any) { r.failed = args[0].(string) }

func TestSkipFailsWhenPrivilegesAreRequired(t *testing.T) {
	t.Setenv(Env, "")
	r := &recorder{}
	Skip(r, "needs %s", "root")
	if r.skipped != "needs root" || r.failed != "" {
		t.Errorf("without %s: skipped %q failed %q", Env, r.skipped, r.failed)
	}
	t.Setenv(Env, "1")
	r = &recorder{}
	Skip(r, "needs %s", "root")
	if r.skipped != "" || !strings.HasPrefix(r.failed, "needs root (GPUJOB_REQUIRE_PRIV=1") {
		t.Errorf("with %s=1: skipped %q failed %q", Env, r.skipped, r.failed)
	}
}
