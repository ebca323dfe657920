package driver

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpujob/gpujob/driver/supervisor"
	"github.com/gpujob/gpujob/internal/safename"
)

// A host member's state directory holds what the driver and the root
// supervisor exchange: the supervisor's spec (with the Consul token), its
// events, the ranks' process groups, the stop deadline and the executor's
// log. It lives under the driver's run root (/run/gpujob/tasks/<alloc
// ID>/<task>), root's and closed to everyone else, never in the task's own
// directories: Nomad gives those (private/ too) to the task's user before
// StartTask, and a prestart task of the same allocation, running as that
// user, could have planted a symlink or a FIFO there for root to follow.

// Files of a host member's state directory.
const (
	specFileName         = "gpujob-supervisor.json"
	eventsFileName       = "gpujob-events.jsonl"
	groupsFileName       = "gpujob-rank-groups.json"
	stopDeadlineFileName = "gpujob-stop-deadline"
	executorLogName      = "executor.out"
)

// tasksDirName is the run root's directory of host members' state.
const tasksDirName = "tasks"

// taskStateDir is the state directory of task in allocation allocID.
func taskStateDir(runRoot, allocID, task string) (string, error) {
	if !validAllocID.MatchString(allocID) {
		return "", fmt.Errorf("allocation ID %q is not a UUID; refusing to name a directory after it", allocID)
	}
	return filepath.Join(runRoot, tasksDirName, allocID, safename.Encode(task)), nil
}

// placeStateFiles points the spec's files into dir.
func placeStateFiles(s *supervisor.Spec, dir string) {
	s.EventsFile = filepath.Join(dir, eventsFileName)
	s.GroupsFile = filepath.Join(dir, groupsFileName)
	s.StopDeadlineFile = filepath.Join(dir, stopDeadlineFileName)
}

// makeStateDir creates dir and every directory from runRoot down to it,
// each the driver's own user's and writable by no one else (mode 0700
// below runRoot), through file descriptors opened without following
// symlinks. An existing directory of another owner, or one others can
// write, is refused: it is not one the driver made.
func makeStateDir(runRoot, dir string) error {
	rel, err := filepath.Rel(runRoot, dir)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") || filepath.IsAbs(rel) {
		return fmt.Errorf("state directory %s is not under the run root %s", dir, runRoot)
	}
	if err := os.MkdirAll(runRoot, 0o755); err != nil {
		return fmt.Errorf("creating the run root: %w", err)
	}
	fd, err := unix.Open(runRoot, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening the run root %s: %w", runRoot, err)
	}
	if err := checkOwnDir(fd, runRoot); err != nil {
		unix.Close(fd)
		return err
	}
	path := runRoot
	for _, name := range strings.Split(rel, string(filepath.Separator)) {
		path = filepath.Join(path, name)
		if err := unix.Mkdirat(fd, name, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			unix.Close(fd)
			return fmt.Errorf("creating %s: %w", path, err)
		}
		next, err := unix.Openat(fd, name, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("opening %s (a directory, not a symlink, is needed): %w", path, err)
		}
		fd = next
		if err := checkOwnDir(fd, path); err != nil {
			unix.Close(fd)
			return err
		}
		// Mkdirat's mode went through the umask; an existing one is ours.
		if err := unix.Fchmod(fd, 0o700); err != nil {
			unix.Close(fd)
			return fmt.Errorf("closing %s to other users: %w", path, err)
		}
	}
	unix.Close(fd)
	return nil
}

// checkOwnDir refuses a directory that is not the driver's user's, or that
// another user may write.
func checkOwnDir(fd int, path string) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("checking %s: %w", path, err)
	}
	if int(st.Uid) != os.Geteuid() || st.Mode&0o022 != 0 {
		return fmt.Errorf("%s belongs to UID %d with mode %04o; the driver keeps task state only in a directory of its own UID %d "+
			"that no one else may write", path, st.Uid, st.Mode&0o7777, os.Geteuid())
	}
	return nil
}

// removeStateDir removes a task's state directory, and its allocation's
// once no other task's is left in it.
func removeStateDir(dir string) error {
	if dir == "" {
		return nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	// Fails while a sibling task's directory is there, as it should.
	_ = os.Remove(filepath.Dir(dir))
	return nil
}
