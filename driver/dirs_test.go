package driver

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gpujob/gpujob/driver/supervisor"
	"github.com/gpujob/gpujob/internal/testpriv"
)

// nobodyCred is a task user other than the test's own (which is root
// wherever chown can be tested).
var nobodyCred = &supervisor.Credential{User: "nobody", UID: 65534, GID: 65534, Groups: []uint32{65534}}

func needRoot(t *testing.T) {
	t.Helper()
	testpriv.NeedRoot(t, "giving a directory to another user")
}

func owner(t *testing.T, path string) (uid uint32, mode os.FileMode) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Uid, fi.Mode()
}

func TestCheckpointDirBelongsToTheTaskUser(t *testing.T) {
	needRoot(t)
	// The umask must not decide the modes.
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	root := filepath.Join(t.TempDir(), "ckpt")
	dir := filepath.Join(root, "ml", "bert", "run-1")
	if err := prepareCheckpointDir(root, dir, nobodyCred); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(root, "ml"), filepath.Join(root, "ml", "bert")} {
		if uid, mode := owner(t, p); uid != 0 || mode.Perm() != 0o755 || !mode.IsDir() {
			t.Errorf("%s: UID %d mode %v, want root's 0755 directory", p, uid, mode)
		}
	}
	if uid, mode := owner(t, dir); uid != nobodyCred.UID || mode.Perm() != 0o700 {
		t.Errorf("%s: UID %d mode %v, want nobody's 0700", dir, uid, mode)
	}
	// Again (a restart of the task): the directory is the user's already.
	if err := prepareCheckpointDir(root, dir, nobodyCred); err != nil {
		t.Fatalf("a second start of the same run: %v", err)
	}
	// Another user's task may not take it over.
	alice := &supervisor.Credential{User: "alice", UID: 1000, GID: 1000}
	err := prepareCheckpointDir(root, dir, alice)
	if err == nil || !strings.Contains(err.Error(), "belongs to UID 65534, but the task runs as user alice") {
		t.Fatalf("another user's task: %v, want a refusal naming both", err)
	}
	// Nor may root's (allow_root): root writing where nobody can plant
	// symlinks is how root gets tricked.
	err = prepareCheckpointDir(root, dir, nil)
	if err == nil || !strings.Contains(err.Error(), "belongs to UID 65534") {
		t.Fatalf("a root task in nobody's directory: %v, want a refusal", err)
	}
}

// Two members of one job on one node start at once: both must get the
// directory, neither may see it as the driver's own between its creation
// and its handover (found by the e2e tests: one member failed with
// "belongs to UID 0, but the task runs as user nobody").
func TestCheckpointDirConcurrentStartsOfOneJob(t *testing.T) {
	needRoot(t)
	for i := 0; i < 50; i++ {
		root := filepath.Join(t.TempDir(), "ckpt")
		dir := filepath.Join(root, "default", "job", "run")
		errs := make(chan error, 4)
		for j := 0; j < cap(errs); j++ {
			go func() { errs <- prepareCheckpointDir(root, dir, nobodyCred) }()
		}
		for j := 0; j < cap(errs); j++ {
			if err := <-errs; err != nil {
				t.Fatalf("attempt %d: %v", i, err)
			}
		}
		if uid, mode := owner(t, dir); uid != nobodyCred.UID || mode.Perm() != 0o700 {
			t.Fatalf("attempt %d: UID %d mode %v, want nobody's 0700", i, uid, mode)
		}
	}
}

func TestCheckpointDirRefusesWhatAUserControls(t *testing.T) {
	needRoot(t)
	root := t.TempDir()
	// A job run by hand as nobody has its checkpoints in ml/job itself: a
	// submitted run of the same job must not go under nobody's directory.
	if err := prepareCheckpointDir(root, filepath.Join(root, "ml", "job"), nobodyCred); err != nil {
		t.Fatal(err)
	}
	err := prepareCheckpointDir(root, filepath.Join(root, "ml", "job", "run-2"), &supervisor.Credential{User: "alice", UID: 1000, GID: 1000})
	if err == nil || !strings.Contains(err.Error(), "belongs to UID 65534 with mode 0700") {
		t.Fatalf("under a user's directory: %v, want a refusal", err)
	}

	// A symlink on the way is not followed, even one root made.
	target := t.TempDir()
	if err := os.Symlink(target, filepath.Join(root, "evil")); err != nil {
		t.Fatal(err)
	}
	err = prepareCheckpointDir(root, filepath.Join(root, "evil", "job"), nobodyCred)
	if err == nil || !strings.Contains(err.Error(), "not a symlink") {
		t.Fatalf("through a symlink: %v, want a refusal", err)
	}
	if entries, _ := os.ReadDir(target); len(entries) != 0 {
		t.Fatalf("created %v through the symlink", entries)
	}
	// A world-writable parent would let anyone rename what is below it.
	if err := os.Mkdir(filepath.Join(root, "open"), 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(root, "open"), 0o777)
	err = prepareCheckpointDir(root, filepath.Join(root, "open", "job"), nobodyCred)
	if err == nil || !strings.Contains(err.Error(), "writable by no one else") {
		t.Fatalf("under a world-writable directory: %v, want a refusal", err)
	}
	// Never outside the root.
	err = prepareCheckpointDir(root, filepath.Join(root, "..", "escaped"), nobodyCred)
	if err == nil || !strings.Contains(err.Error(), "not under checkpoint_root") {
		t.Fatalf("outside the root: %v, want a refusal", err)
	}
}

func TestCheckpointDirOfTheDriversOwnUser(t *testing.T) {
	// A client that is not root runs the ranks as itself (no credential).
	root := t.TempDir()
	dir := filepath.Join(root, "default", "job", "r")
	if err := prepareCheckpointDir(root, dir, nil); err != nil {
		t.Fatal(err)
	}
	if uid, mode := owner(t, dir); int(uid) != os.Geteuid() || mode.Perm() != 0o700 {
		t.Fatalf("UID %d mode %v, want the driver's own 0700", uid, mode)
	}
}

func TestPrivateDirIsTheDriversAlone(t *testing.T) {
	needRoot(t)
	// As Nomad leaves it: world-writable, owned by nobody.
	dir := filepath.Join(t.TempDir(), "private")
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o777)
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := securePrivateDir(dir); err != nil {
		t.Fatal(err)
	}
	if uid, mode := owner(t, dir); uid != 0 || mode.Perm() != 0o700 {
		t.Fatalf("UID %d mode %v, want root's 0700", uid, mode)
	}
	// A symlink in its place is refused, not followed.
	link := filepath.Join(t.TempDir(), "private")
	target := t.TempDir()
	os.Chmod(target, 0o777)
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := securePrivateDir(link); err == nil {
		t.Fatal("a symlinked private dir was accepted")
	}
	if _, mode := owner(t, target); mode.Perm() != 0o777 {
		t.Fatalf("the symlink's target was changed to %v", mode)
	}
}
