package driver

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpujob/gpujob/driver/supervisor"
)

// The directories the driver prepares as root for a task whose ranks run as
// another user. Every step goes through file descriptors opened with
// O_NOFOLLOW, never a path a second time: a user who can write somewhere on
// the way must not be able to swap in a symlink and have root create or
// chown something elsewhere.

// prepareCheckpointDir creates the task's checkpoint directory dir under
// root. root and the directories between it and dir belong to the driver's
// user, mode 0755, and are not writable by anyone else (or the job is
// refused); dir itself belongs to the ranks' user (cred; nil: the driver's
// own), mode 0700, so that other users' tasks cannot read or plant files in
// it. An existing dir must already belong to that user: the driver never
// hands one user's checkpoints to another.
func prepareCheckpointDir(root, dir string, cred *supervisor.Credential) error {
	rel, err := filepath.Rel(root, dir)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") || filepath.IsAbs(rel) {
		return fmt.Errorf("checkpoint directory %s is not under checkpoint_root %s", dir, root)
	}
	// checkpoint_root is the operator's: it may be a symlink to a bigger
	// disk, and is created if missing.
	if err := os.MkdirAll(root, 0o755); err != nil {
		return fmt.Errorf("creating checkpoint_root: %w", err)
	}
	fd, err := unix.Open(root, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening checkpoint_root %s: %w", root, err)
	}
	self := os.Geteuid()
	parts := strings.Split(rel, string(filepath.Separator))
	path := root
	for i, name := range parts {
		path = filepath.Join(path, name)
		leaf := i == len(parts)-1
		mode := uint32(0o755)
		if leaf {
			mode = 0o700
		}
		created := true
		if err := unix.Mkdirat(fd, name, mode); err != nil {
			if !errors.Is(err, unix.EEXIST) {
				unix.Close(fd)
				return fmt.Errorf("creating %s: %w", path, err)
			}
			created = false
		}
		next, err := unix.Openat(fd, name, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("opening %s (a directory, not a symlink, is needed): %w", path, err)
		}
		fd = next
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return fmt.Errorf("checking %s: %w", path, err)
		}
		if leaf {
			err = ownLeaf(fd, path, &st, created, mode, cred)
		} else {
			err = ownParent(fd, path, &st, created, mode, self)
		}
		if err != nil {
			unix.Close(fd)
			return err
		}
	}
	unix.Close(fd)
	return nil
}

// ownParent checks (or, when just created, sets) that a directory between
// checkpoint_root and a task's checkpoint directory is the driver's and
// writable by it alone: only then can no task's user rename what lies
// below it.
func ownParent(fd int, path string, st *unix.Stat_t, created bool, mode uint32, self int) error {
	if created {
		// Mkdirat's mode went through the umask.
		if err := unix.Fchmod(fd, mode); err != nil {
			return fmt.Errorf("setting the mode of %s: %w", path, err)
		}
		return nil
	}
	if int(st.Uid) != self || st.Mode&0o022 != 0 {
		return fmt.Errorf("checkpoint directory parent %s belongs to UID %d with mode %04o; it must belong to the driver's UID %d "+
			"and be writable by no one else (it may be the checkpoint directory of a job run as another user without "+
			"gpujob submit: move it away)", path, st.Uid, st.Mode&0o7777, self)
	}
	return nil
}

// leafHandoverWait bounds how long a checkpoint directory that another
// start of the task's job is creating may stay the driver's own.
const leafHandoverWait = 2 * time.Second

// ownLeaf gives a new checkpoint directory to the ranks' user, or checks
// that an existing one is theirs.
func ownLeaf(fd int, path string, st *unix.Stat_t, created bool, mode uint32, cred *supervisor.Credential) error {
	uid, gid := uint32(os.Geteuid()), uint32(os.Getegid())
	who := "the driver's own user"
	if cred != nil {
		uid, gid, who = cred.UID, cred.GID, "user "+cred.User
	}
	if !created {
		// Another member of the same job on this node may have created it
		// a moment ago, as the driver's user, and be about to give it
		// away (Fchown below): wait for that rather than fail a member
		// that started at the same time as its sibling.
		for deadline := time.Now().Add(leafHandoverWait); st.Uid != uid && int(st.Uid) == os.Geteuid() && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
			if err := unix.Fstat(fd, st); err != nil {
				return fmt.Errorf("checking %s: %w", path, err)
			}
		}
		if st.Uid != uid {
			return fmt.Errorf("checkpoint directory %s belongs to UID %d, but the task runs as %s (UID %d): "+
				"the driver does not hand one user's checkpoints to another; chown it or remove it", path, st.Uid, who, uid)
		}
		return nil
	}
	if err := unix.Fchown(fd, int(uid), int(gid)); err != nil {
		return fmt.Errorf("giving %s to %s: %w", path, who, err)
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return fmt.Errorf("setting the mode of %s: %w", path, err)
	}
	return nil
}

// securePrivateDir makes the task's private directory the driver's alone
// (mode 0700). Nomad creates it world-writable and owned by nobody. Tasks
// started by this driver keep nothing there (statedir.go) and have it closed
// by secureTaskDirs; a task of an older driver, recovered after an upgrade,
// still has its supervisor's spec, events and rank groups there.
func securePrivateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	fd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", dir, err)
	}
	defer unix.Close(fd)
	if os.Geteuid() == 0 {
		if err := unix.Fchown(fd, 0, 0); err != nil {
			return fmt.Errorf("taking %s: %w", dir, err)
		}
	}
	if err := unix.Fchmod(fd, 0o700); err != nil {
		return fmt.Errorf("closing %s to other users: %w", dir, err)
	}
	return nil
}
