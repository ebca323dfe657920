package supervisor

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpujob/gpujob/internal/testpriv"
)

var nobody = &Credential{User: "nobody", UID: 65534, GID: 65534, Groups: []uint32{65534}}

func needRoot(t *testing.T) {
	t.Helper()
	testpriv.NeedRoot(t, "starting processes as another user")
}

// openDir is a directory any user can write to, under parents any user can
// traverse (t.TempDir's are root's own, mode 0700).
func openDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gpujob-identity-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestWorkerEnvIdentityAndGPUs(t *testing.T) {
	gpus := "GPU-a,GPU-b"
	spec := &Spec{NProcPerNode: 1, RunID: "default/job", RunAs: nobody, VisibleDevices: &gpus,
		Env: map[string]string{"NCCL_DEBUG": "INFO", "CUDA_VISIBLE_DEVICES": "GPU-x,GPU-y,GPU-z"}}
	p := Placement{Round: 1, NNodes: 1, WorldSize: 1, MasterAddr: "127.0.0.1:1"}
	// What Nomad hands a task of a root client: the client's identity.
	base := []string{"HOME=/root", "USER=root", "LOGNAME=root", "XDG_RUNTIME_DIR=/run/user/0",
		"NOMAD_TASK_DIR=/alloc/t/local", "CUDA_VISIBLE_DEVICES=GPU-a,GPU-b,GPU-c,GPU-d"}
	env := envMap(WorkerEnv(base, spec, p, 0))
	want := map[string]string{
		"HOME": "/alloc/t/local", // nobody has no home: the task's local dir
		"USER": "nobody", "LOGNAME": "nobody",
		// The reservation, not the task's env, not the client's.
		"CUDA_VISIBLE_DEVICES": gpus, "NVIDIA_VISIBLE_DEVICES": gpus,
		"NCCL_DEBUG": "INFO",
	}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("%s = %q, want %q", k, env[k], v)
		}
	}
	if v, ok := env["XDG_RUNTIME_DIR"]; ok {
		t.Errorf("root's XDG_RUNTIME_DIR %q reached a rank of nobody", v)
	}

	// A user with a home gets it; the task config's env still wins.
	alice := &Credential{User: "alice", UID: 1000, GID: 1000, Home: "/home/alice"}
	spec.RunAs = alice
	if env := envMap(WorkerEnv(base, spec, p, 0)); env["HOME"] != "/home/alice" {
		t.Errorf("HOME = %q, want alice's", env["HOME"])
	}
	spec.Env["HOME"] = "/scratch"
	if env := envMap(WorkerEnv(base, spec, p, 0)); env["HOME"] != "/scratch" {
		t.Errorf("HOME = %q, want the task config's /scratch", env["HOME"])
	}

	// No GPU reserved: none visible, whatever the environment says.
	none := ""
	spec.VisibleDevices = &none
	if env := envMap(WorkerEnv(base, spec, p, 0)); env["CUDA_VISIBLE_DEVICES"] != "" {
		t.Errorf("CUDA_VISIBLE_DEVICES = %q for a task without GPUs", env["CUDA_VISIBLE_DEVICES"])
	}
	// Without the driver's word (nil), the environment's stays.
	spec.VisibleDevices, spec.RunAs, spec.Env = nil, nil, nil
	env = envMap(WorkerEnv(base, spec, p, 0))
	if env["CUDA_VISIBLE_DEVICES"] != "GPU-a,GPU-b,GPU-c,GPU-d" || env["HOME"] != "/root" {
		t.Errorf("without a reservation or user: %v", env)
	}
}

func TestRunAsArgsRoundTrip(t *testing.T) {
	for _, c := range []*Credential{nobody, {User: "alice", UID: 1000, GID: 100, Groups: []uint32{100, 27}, Home: "/home/alice"}} {
		argv := []string{"/bin/sh", "-c", "echo -- --uid 0"}
		got, err := parseRunAs(c.RunAsArgs(argv))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got.cred, c) || !reflect.DeepEqual(got.argv, argv) || got.spec != "" {
			t.Fatalf("round trip: %+v, want %+v %q", got, c, argv)
		}
	}
	argv := []string{"id", "--", "-u"}
	got, err := parseRunAs(RunAsArgs("/run/gpujob/tasks/a/t/gpujob-supervisor.json", argv))
	if err != nil || got.spec != "/run/gpujob/tasks/a/t/gpujob-supervisor.json" || got.cred != nil || !reflect.DeepEqual(got.argv, argv) {
		t.Fatalf("spec round trip: %+v %v", got, err)
	}
	for _, bad := range [][]string{{"--uid", "x", "--", "id"}, {"--uid", "1"}, {"--uid", "1", "--"}, {"--bogus", "1", "--", "id"}, {"--spec"}} {
		if _, err := parseRunAs(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// TestRunAsTakesTheTasksEnvironmentFromItsSpec is `nomad alloc exec` into
// a host member: the helper starts with the supervisor's own environment
// (as the executor gives it), and the command gets the task's, from the
// spec, with the task config's env and the user's identity on top, and
// runs as the ranks' user; nothing of the helper's own environment reaches
// it.
func TestRunAsTakesTheTasksEnvironmentFromItsSpec(t *testing.T) {
	needRoot(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := openDir(t)
	// Found in the task's PATH only.
	if err := os.WriteFile(filepath.Join(bin, "whoami-env"), []byte("#!/bin/sh\necho \"$(id -u) $MY_FLAG $SPEC_FLAG $HOME [$HELPER_ONLY] [$RANK]\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	spec := &Spec{Command: "/bin/true", NProcPerNode: 1, RunID: "default/job", Min: 1, Max: 1,
		Self: Member{ID: "a1", Name: "job.g[0]", Addr: "127.0.0.1:1"}, RunAs: nobody,
		TaskEnv: []string{"PATH=/usr/bin:/bin:" + bin, "MY_FLAG=task", "NOMAD_TASK_DIR=/alloc/t/local"},
		Env:     map[string]string{"SPEC_FLAG": "config"}}
	path := filepath.Join(dir, "spec.json")
	if err := WriteSpec(path, spec); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, append([]string{RunAsCommand}, RunAsArgs(path, []string{"whoami-env"})...)...)
	cmd.Env = append(RootEnv("a1", "t"), "HELPER_ONLY=leak")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "65534 task config /alloc/t/local [] []" {
		t.Fatalf("got %q, want nobody with the task's and the config's variables, the task dir as HOME, nothing of the helper's, no round", got)
	}
}

// TestRunAsDropsToTheUser is `nomad alloc exec` into a task of nobody: the
// command runs as nobody, with nobody's groups only (never root's GID 0),
// and without the client's secrets or identity.
func TestRunAsDropsToTheUser(t *testing.T) {
	needRoot(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{RunAsCommand}, nobody.RunAsArgs([]string{"/bin/sh", "-c", `echo "$(id -u) $(id -g) [$(id -G)] $HOME $USER [$CONSUL_HTTP_TOKEN]"`})...)
	cmd := exec.Command(self, args...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/root", "USER=root", "NOMAD_TASK_DIR=/alloc/t/local", "CONSUL_HTTP_TOKEN=secret"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "65534 65534 [65534] /alloc/t/local nobody []" {
		t.Fatalf("got %q, want nobody's IDs, groups, home and name, and no token", got)
	}

	// A command the user may not execute fails as that user would.
	dir := openDir(t)
	script := filepath.Join(dir, "root-only.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho ran\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	cmd = exec.Command(self, append([]string{RunAsCommand}, nobody.RunAsArgs([]string{script})...)...)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	out, err = cmd.CombinedOutput()
	if err == nil || strings.Contains(string(out), "ran") {
		t.Fatalf("nobody ran root's 0700 script: %s", out)
	}
}

// TestRanksRunAsTheUser starts real ranks with a credential: they run as
// nobody with nobody's groups, while the supervisor stays who it is.
func TestRanksRunAsTheUser(t *testing.T) {
	needRoot(t)
	dir := openDir(t)
	spec := &Spec{Command: "/bin/sh", Args: []string{"-c", `echo "$(id -u) $(id -G)" > "$STATE/ids.$LOCAL_RANK"`},
		NProcPerNode: 2, RunID: "default/job", Self: Member{ID: "a1", Name: "job.g[0]", Addr: "127.0.0.1:1"}, Min: 1, Max: 1,
		RunAs: nobody, Workdir: dir}
	out := &safeBuffer{}
	sup, err := New(spec, newFakeCoord(1, nil), []string{"PATH=/usr/bin:/bin", "STATE=" + dir}, out, out)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if code := sup.Run(ctx); code != 0 {
		t.Fatalf("exit %d: %s", code, out.String())
	}
	for _, r := range []string{"0", "1"} {
		b, err := os.ReadFile(filepath.Join(dir, "ids."+r))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(string(b)); got != "65534 65534" {
			t.Errorf("rank %s ran as %q, want nobody with nobody's group alone", r, got)
		}
	}
}

// TestRankStartFailureExplainsTheUser: a rank of nobody that cannot enter
// its working directory says whose permission is missing.
func TestRankStartFailureExplainsTheUser(t *testing.T) {
	needRoot(t)
	private := t.TempDir() // root's, mode 0700
	spec := &Spec{Command: "/bin/true", NProcPerNode: 1, RunID: "default/job", Workdir: private, RunAs: nobody}
	_, err := startWorkers(spec, Placement{MasterAddr: "127.0.0.1:1"}, nil, os.Stdout, os.Stderr, func(c *exec.Cmd) error { return c.Start() })
	if err == nil || !strings.Contains(err.Error(), "the ranks run as user nobody, who must be able to reach the working directory "+private) {
		t.Fatalf("error %v, want one that names the user and the directory", err)
	}
}
