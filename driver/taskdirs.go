package driver

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/hashicorp/nomad/client/allocdir"
	"github.com/hashicorp/nomad/plugins/drivers"
	"golang.org/x/sys/unix"

	"github.com/gpujob/gpujob/driver/supervisor"
)

// Nomad makes every directory of an allocation mode 0777 and gives it to
// nobody (allocdir.dropDirPermissions): on a driver without filesystem
// isolation any process of the machine, whatever its user, can then read
// and write any task's local/, secrets/ (workload identity tokens, Vault
// tokens, rendered secrets) and the allocation's shared alloc/ (data, logs).
// Users are the only wall between the tasks of a shared client, so the
// driver gives a task's directories to the user its ranks run as, closed to
// everyone else, before any of its processes starts. Nomad's client, the
// executor and logmon are root and keep their access; other tasks of the
// same group should run as the same user.

// taskDirModes are the task's own directories (relative to the allocation
// directory) and the mode each gets; the owner is the ranks' user, except
// for private/, which is root's (Nomad keeps its own Vault token there and
// nothing of the task's needs it).
func taskDirModes(task string) []taskDirMode {
	return []taskDirMode{
		{task, 0o700, false},
		{filepath.Join(task, allocdir.TaskLocal), 0o700, false},
		{filepath.Join(task, allocdir.TaskSecrets), 0o700, false},
		{filepath.Join(task, allocdir.TmpDirName), 0o700, false},
		{filepath.Join(task, allocdir.TaskPrivate), 0o700, true},
		// The shared directory may be entered by name, not listed.
		{allocdir.SharedAllocName, 0o711, false},
		{filepath.Join(allocdir.SharedAllocName, allocdir.SharedDataDir), 0o700, false},
		{filepath.Join(allocdir.SharedAllocName, allocdir.TmpDirName), 0o700, false},
		// logmon (root) writes the tasks' logs; they are the allocation's
		// alone to read, through Nomad's API.
		{filepath.Join(allocdir.SharedAllocName, allocdir.LogDirName), 0o700, true},
	}
}

type taskDirMode struct {
	rel    string
	mode   uint32
	isRoot bool // root's rather than the ranks' user's
}

// secureTaskDirs gives the task's directories to cred (nil: the client is
// not root and cannot; nothing is changed) as taskDirModes says. Each is
// opened from the allocation directory, one component at a time, without
// following a symlink, and changed through its file descriptor: the task's
// user may have had a prestart task replace one with a link to somewhere
// root would then hand over. A missing directory is skipped (Nomad makes
// them all; a test harness may not).
func secureTaskDirs(cfg *drivers.TaskConfig, cred *supervisor.Credential) error {
	if cred == nil || cfg.AllocDir == "" {
		return nil
	}
	for _, d := range taskDirModes(cfg.Name) {
		uid, gid := int(cred.UID), int(cred.GID)
		if d.isRoot {
			uid, gid = 0, 0
		}
		err := withDirBeneath(cfg.AllocDir, d.rel, func(fd int) error {
			if err := unix.Fchown(fd, uid, gid); err != nil {
				return err
			}
			return unix.Fchmod(fd, d.mode)
		})
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return fmt.Errorf("giving the task's directory %s to its user %s: %w", filepath.Join(cfg.AllocDir, d.rel), cred.User, err)
		}
	}
	return nil
}

// withDirBeneath opens the directory rel beneath root without following a
// symlink on the way (openat2 RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, else
// O_NOFOLLOW on each component where the kernel lacks openat2), checks it
// is a directory, and calls fn with its descriptor.
func withDirBeneath(root, rel string, fn func(fd int) error) error {
	rootFD, err := unix.Open(root, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(rootFD)
	fd, err := openBeneath(rootFD, rel, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOTDIR) {
			return fmt.Errorf("%s is not a plain directory (a symlink or something else was put there): %w", rel, err)
		}
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("%s is not a directory", rel)
	}
	return fn(fd)
}

// openBeneath opens rel beneath the directory dirFD, refusing symlinks and
// any path that would leave it.
func openBeneath(dirFD int, rel string, flags int) (int, error) {
	how := unix.OpenHow{Flags: uint64(flags | unix.O_NOFOLLOW), Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	fd, err := unix.Openat2(dirFD, rel, &how)
	if !errors.Is(err, unix.ENOSYS) {
		return fd, err
	}
	// Kernels before 5.6: component by component.
	cur, err := unix.Dup(dirFD)
	if err != nil {
		return -1, err
	}
	parts := splitPath(rel)
	for i, name := range parts {
		if name == ".." {
			unix.Close(cur)
			return -1, unix.EXDEV
		}
		f := unix.O_DIRECTORY | unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOFOLLOW
		if i == len(parts)-1 {
			f = flags | unix.O_NOFOLLOW
		}
		next, err := unix.Openat(cur, name, f, 0)
		unix.Close(cur)
		if err != nil {
			return -1, err
		}
		cur = next
	}
	return cur, nil
}

// splitPath splits a relative path into its non-empty components.
func splitPath(rel string) []string {
	var out []string
	dir := filepath.Clean(rel)
	for dir != "." && dir != "/" && dir != "" {
		out = append([]string{filepath.Base(dir)}, out...)
		dir = filepath.Dir(dir)
	}
	return out
}
