package testpriv

import (
	"fmt"
	"strings"
	"testing"
)

// recorder stands in for a test: Skip and Fatal record their message and,
// like the real ones, end the helper (a panic the test recovers).
type recorder struct {
	skipped, failed string
}

type stopped struct{}

func (r *recorder) Helper()           {}
func (r *recorder) Skip(args ...any)  { r.skipped = fmt.Sprint(args...); panic(stopped{}) }
func (r *recorder) Fatal(args ...any) { r.failed = fmt.Sprint(args...); panic(stopped{}) }

// call runs f against a fresh recorder, as a test would until it ends.
func call(f func(r *recorder)) (r *recorder) {
	r = &recorder{}
	defer func() {
		if v := recover(); v != nil {
			if _, ok := v.(stopped); !ok {
				panic(v)
			}
		}
	}()
	f(r)
	return r
}

func TestSkipFailsWhenRequired(t *testing.T) {
	t.Setenv(Env, "")
	r := call(func(r *recorder) { Skip(r, "needs %s", "root") })
	if r.skipped != "needs root" || r.failed != "" {
		t.Errorf("without %s: skipped %q failed %q", Env, r.skipped, r.failed)
	}
	t.Setenv(Env, "1")
	r = call(func(r *recorder) { Skip(r, "needs %s", "root") })
	if r.skipped != "" || !strings.HasPrefix(r.failed, "needs root (GPUJOB_REQUIRE_PRIV=1") {
		t.Errorf("with %s=1: skipped %q failed %q", Env, r.skipped, r.failed)
	}
}

func TestNeedCommand(t *testing.T) {
	t.Setenv(Env, "")
	var path string
	r := call(func(r *recorder) { path = NeedCommand(r, "sh", "apt-get install dash") })
	if r.skipped != "" || r.failed != "" || !strings.HasSuffix(path, "/sh") {
		t.Errorf("sh: path %q skipped %q failed %q", path, r.skipped, r.failed)
	}
	const missing = "gpujob-no-such-command"
	r = call(func(r *recorder) { NeedCommand(r, missing, "apt-get install it") })
	if r.skipped != missing+" is not installed (apt-get install it)" || r.failed != "" {
		t.Errorf("missing, not required: skipped %q failed %q", r.skipped, r.failed)
	}
	t.Setenv(Env, "1")
	r = call(func(r *recorder) { NeedCommand(r, missing, "apt-get install it") })
	if r.skipped != "" || !strings.Contains(r.failed, "(apt-get install it)") || !strings.Contains(r.failed, Env+"=1") {
		t.Errorf("missing, required: skipped %q failed %q", r.skipped, r.failed)
	}
}

func TestNeedPython(t *testing.T) {
	python := NeedCommand(t, "python3", "apt-get install python3")
	t.Setenv(Env, "1")
	r := call(func(r *recorder) { NeedPython(r, python, "nothing to install", "json", "os") })
	if r.skipped != "" || r.failed != "" {
		t.Errorf("json and os: skipped %q failed %q", r.skipped, r.failed)
	}
	r = call(func(r *recorder) {
		NeedPython(r, python, "apt-get install python3-nosuch", "json", "gpujob_no_such_module")
	})
	if r.skipped != "" || !strings.Contains(r.failed, "gpujob_no_such_module") ||
		!strings.Contains(r.failed, "(apt-get install python3-nosuch)") {
		t.Errorf("a missing module, required: skipped %q failed %q", r.skipped, r.failed)
	}
	t.Setenv(Env, "")
	r = call(func(r *recorder) { NeedPython(r, "/nonexistent/python3", "apt-get install python3") })
	if r.skipped == "" || r.failed != "" {
		t.Errorf("no interpreter, not required: skipped %q failed %q", r.skipped, r.failed)
	}
}
