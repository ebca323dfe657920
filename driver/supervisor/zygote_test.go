package supervisor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpujob/gpujob/internal/testpriv"
)

// python is the interpreter the zygote tests run, skipped where there is none.
func python(t *testing.T) string {
	t.Helper()
	p := testpriv.NeedCommand(t, "python3", "apt-get install python3")
	// A shim (pyenv) is not an interpreter that can be preloaded.
	if real, err := filepath.EvalSymlinks("/usr/bin/python3"); err == nil {
		return real
	}
	return p
}

// writeScript writes a script and a module beside it (for the relative
// import) into a fresh directory and returns the script's path.
func writeScript(t *testing.T, body string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "helper_mod.py"), []byte("VALUE = 'from-helper'\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "script.py")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// runRound starts one round of spec's ranks with pool (nil: cold) and
// returns their exits and output.
func runRound(t *testing.T, spec *Spec, pool *zygotes, p Placement) ([]exit, string) {
	t.Helper()
	out := &safeBuffer{}
	w, err := startWorkersWith(spec, p, []string{"PATH=/usr/bin:/bin", "NOMAD_ALLOC_ID=test"}, out, out, startDirect, pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	var exits []exit
	timeout := time.After(60 * time.Second)
	for len(exits) < spec.NProcPerNode {
		select {
		case e := <-w.exits:
			exits = append(exits, e)
		case <-timeout:
			w.stop(0)
			t.Fatalf("the round did not end; output:\n%s", out.String())
		}
	}
	<-w.done
	return exits, out.String()
}

func newPool(t *testing.T, spec *Spec) *zygotes {
	t.Helper()
	pool, err := newZygotes(spec, []string{"PATH=/usr/bin:/bin", "NOMAD_ALLOC_ID=test"}, os.Stderr, startDirect)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.close)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if warning := pool.prepare(ctx); warning != "" {
		t.Fatalf("preload: %s", warning)
	}
	return pool
}

// The behaviour a user's script sees must be the same preloaded or cold:
// __name__, sys.argv, a relative import, the working directory, the rank's
// environment (in os.environ and in /proc/PID/environ), the exit code.
func TestPreloadedRankBehavesAsACold(t *testing.T) {
	py := python(t)
	script := writeScript(t, `
import os, sys
import helper_mod
def environ_file():
    with open("/proc/self/environ", "rb") as f:
        return dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
if __name__ == "__main__":
    pe = environ_file()
    print("name", __name__, "argv", sys.argv[1:], "helper", helper_mod.VALUE, "cwd", os.getcwd())
    print("rank", os.environ["RANK"], "world", os.environ["WORLD_SIZE"], "proc", pe.get(b"RANK", b"-").decode(),
          "pad", "GPUJOB_PRELOAD_PAD" in os.environ, "json", "json" in sys.modules)
    sys.exit(int(os.environ["RANK"]) + 3)
`)
	work := t.TempDir()
	spec := &Spec{Command: py, Args: []string{script, "--lr", "0.1"}, NProcPerNode: 2, LogPrefix: true,
		Workdir: work, Preload: []string{"json"}}
	p := Placement{RankOffset: 4, WorldSize: 6, MasterAddr: "127.0.0.1:1"}

	coldExits, cold := runRound(t, spec, nil, p)
	warmExits, warm := runRound(t, spec, newPool(t, spec), p)

	for _, out := range []string{cold, warm} {
		for _, want := range []string{
			"[rank 4] name __main__ argv ['--lr', '0.1'] helper from-helper cwd " + work,
			"[rank 5] rank 5 world 6 proc 5 pad False",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
	}
	if !strings.Contains(warm, "json True") {
		t.Errorf("the preloaded rank did not find json already imported:\n%s", warm)
	}
	codes := func(es []exit) map[int]int {
		m := map[int]int{}
		for _, e := range es {
			if e.Err != nil {
				t.Errorf("rank %d: %v", e.Rank, e.Err)
			}
			m[e.Rank] = e.Code
		}
		return m
	}
	if c, w := codes(coldExits), codes(warmExits); c[4] != 7 || c[5] != 8 || w[4] != 7 || w[5] != 8 {
		t.Errorf("exit codes cold %v, preloaded %v; want 7 and 8 for ranks 4 and 5", c, w)
	}
}

// An exception prints its traceback and exits 1; a zygote serves round
// after round.
func TestPreloadedRankExceptionAndManyRounds(t *testing.T) {
	py := python(t)
	script := writeScript(t, "import os\nif os.environ['GPUJOB_GENERATION'] == '2':\n    raise ValueError('boom')\nprint('ok')\n")
	spec := &Spec{Command: py, Args: []string{script}, NProcPerNode: 1, Preload: []string{"json"}}
	pool := newPool(t, spec)
	for round := 1; round <= 3; round++ {
		exits, out := runRound(t, spec, pool, Placement{Round: round, WorldSize: 1, MasterAddr: "h:1"})
		want, text := 0, "ok"
		if round == 2 {
			want, text = 1, "ValueError: boom"
		}
		if exits[0].Code != want || !strings.Contains(out, text) {
			t.Errorf("round %d: exit %d, output %q; want %d and %q", round, exits[0].Code, out, want, text)
		}
	}
}

// kill -9 of a preloaded rank is a rank killed by SIGKILL; kill -9 of its
// zygote takes the rank along, and the next round gets a new zygote.
func TestPreloadedRankKilledAndZygoteKilled(t *testing.T) {
	py := python(t)
	script := writeScript(t, "import os, time\nprint('up', flush=True)\nif os.environ['GPUJOB_GENERATION'] != '9':\n    time.sleep(60)\n")
	spec := &Spec{Command: py, Args: []string{script}, NProcPerNode: 1, Preload: []string{"json"}}
	pool := newPool(t, spec)
	p := Placement{WorldSize: 1, MasterAddr: "h:1"}

	for _, victim := range []string{"rank", "zygote"} {
		out := &safeBuffer{}
		w, err := startWorkersWith(spec, p, nil, out, out, startDirect, pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for !strings.Contains(out.String(), "up") && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		rank := w.procs[0].pid
		pid := rank
		if victim == "zygote" {
			pid = pool.get(0).cmd.Process.Pid
		}
		syscall.Kill(pid, syscall.SIGKILL)
		select {
		case e := <-w.exits:
			if e.Code != 137 {
				t.Errorf("%s killed: the rank exited %d, want 137", victim, e.Code)
			}
			if victim == "zygote" && e.Err == nil {
				t.Errorf("zygote killed: no error says so")
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s killed: the rank's end was not reported", victim)
		}
		w.stop(0)
		// A SIGKILL (ours, or the parent-death signal of a rank whose
		// zygote died: the kernel closes the zygote's socket, which
		// reports the end, before it signals the children) takes
		// effect when the rank is next scheduled, not when kill returns.
		if !eventually(func() bool { return !running(rank) }) {
			t.Errorf("%s killed: rank process %d still runs", victim, rank)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if warning := pool.prepare(ctx); warning != "" {
		t.Fatalf("replacing the killed zygote: %s", warning)
	}
	p.Round = 9
	exits, out := runRound(t, spec, pool, p)
	if exits[0].Code != 0 || !strings.Contains(out, "up") {
		t.Errorf("after the zygote was replaced: exit %d, output %q", exits[0].Code, out)
	}
}

// A module that cannot be imported leaves the slot cold, with a warning
// that names it, and the rank still runs.
func TestPreloadFailureStartsCold(t *testing.T) {
	py := python(t)
	script := writeScript(t, "import sys\nprint('cold', 'no_such_module_xyz' in sys.modules)\n")
	spec := &Spec{Command: py, Args: []string{script}, NProcPerNode: 1, Preload: []string{"no_such_module_xyz"}}
	pool, err := newZygotes(spec, nil, os.Stderr, startDirect)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	warning := pool.prepare(ctx)
	if !strings.Contains(warning, "no_such_module_xyz") || !strings.Contains(warning, "ModuleNotFoundError") {
		t.Errorf("warning %q does not name the module and the error", warning)
	}
	if again := pool.prepare(ctx); again != "" {
		t.Errorf("the same failure reported twice: %q", again)
	}
	exits, out := runRound(t, spec, pool, Placement{WorldSize: 1, MasterAddr: "h:1"})
	if exits[0].Code != 0 || !strings.Contains(out, "cold False") {
		t.Errorf("cold start: exit %d, output %q", exits[0].Code, out)
	}
}

func TestValidateRefusesBadPreload(t *testing.T) {
	base := func() *Spec {
		return &Spec{Command: "/usr/bin/python3", Args: []string{"t.py"}, NProcPerNode: 1, Min: 1, Max: 1,
			RunID: "r", Self: Member{ID: "a", Addr: "h:1"}, Preload: []string{"torch"}}
	}
	if err := base().Validate(); err != nil {
		t.Fatalf("a good spec: %v", err)
	}
	s := base()
	s.Preload = []string{"torch", "os; import evil"}
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "preload[1]") {
		t.Errorf("a bad module name: %v", err)
	}
	s = base()
	s.Command = "/bin/bash"
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "Python interpreter") {
		t.Errorf("preload with bash: %v", err)
	}
}
