package driver

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpujob/gpujob/driver/supervisor"
)

func TestTaskStateDirIsTheDriversAlone(t *testing.T) {
	root := t.TempDir()
	dir, err := taskStateDir(root, "5b473489-72dc-508b-b4d1-1205d9a450d9", "train/../x")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(root, "tasks", "5b473489-72dc-508b-b4d1-1205d9a450d9"); filepath.Dir(dir) != want || strings.Contains(filepath.Base(dir), "/") {
		t.Fatalf("state dir %s, want one segment under %s", dir, want)
	}
	if _, err := taskStateDir(root, "../../etc", "train"); err == nil {
		t.Fatal("an allocation ID that is no UUID named a directory")
	}
	if err := makeStateDir(root, dir); err != nil {
		t.Fatal(err)
	}
	for d := dir; d != root; d = filepath.Dir(d) {
		fi, err := os.Lstat(d)
		if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v %v, want a directory of mode 0700", d, fi.Mode(), err)
		}
	}
	var s supervisor.Spec
	placeStateFiles(&s, dir)
	for _, f := range []string{s.EventsFile, s.GroupsFile, s.StopDeadlineFile} {
		if filepath.Dir(f) != dir {
			t.Errorf("%s is not in the state directory %s", f, dir)
		}
	}
	// Made again (a task restarted in place): fine.
	if err := makeStateDir(root, dir); err != nil {
		t.Fatal(err)
	}
	if err := removeStateDir(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(dir)); !os.IsNotExist(err) {
		t.Errorf("the allocation's state directory is left: %v", err)
	}
}

// A symlink or a directory others may write where the state directory goes
// is refused, not followed or used.
func TestMakeStateDirRefusesWhatItDidNotMake(t *testing.T) {
	root := t.TempDir()
	elsewhere := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "tasks"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, filepath.Join(root, "tasks", "a")); err != nil {
		t.Fatal(err)
	}
	if err := makeStateDir(root, filepath.Join(root, "tasks", "a", "train")); err == nil || !strings.Contains(err.Error(), "not a symlink") {
		t.Errorf("through a symlink: %v", err)
	}
	if left, _ := os.ReadDir(elsewhere); len(left) != 0 {
		t.Errorf("made %v through the symlink", left)
	}
	open := filepath.Join(root, "tasks", "b")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := makeStateDir(root, filepath.Join(open, "train")); err == nil || !strings.Contains(err.Error(), "no one else may write") {
		t.Errorf("a world-writable parent: %v", err)
	}
}
