package supervisor

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// ProcessGroup is one rank's process group as the supervisor recorded it:
// the rank's PID (also the group's ID) and the rank's start time, so that a
// reused PID is never mistaken for the rank.
//
// Ranks run in their own groups, so that stopping a rank also stops what it
// spawned (DataLoader workers). Without cgroups (a Nomad client that is not
// root) the executor only kills the supervisor's group: the driver reads
// these records once the supervisor is gone and kills what is left.
type ProcessGroup struct {
	PGID       int    `json:"pgid"`
	StartTicks uint64 `json:"start_ticks"` // /proc/PID/stat starttime
}

// procStat reads the state (field 3) and the start time in clock ticks
// since boot (field 22) of /proc/PID/stat.
func procStat(pid int) (state byte, start uint64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// count fields after its closing parenthesis.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	const stateField, startField = 0, 22 - 3 // fields 3.. follow the name: state is field 3
	if len(f) <= startField {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	start, err = strconv.ParseUint(f[startField], 10, 64)
	return f[stateField][0], start, err
}

// processStart is the start time of pid in clock ticks since boot.
func processStart(pid int) (uint64, error) {
	_, start, err := procStat(pid)
	return start, err
}

// IsZombie reports whether pid has exited and waits to be reaped.
func IsZombie(pid int) bool {
	state, _, err := procStat(pid)
	return err == nil && state == 'Z'
}

// ProcessStart is processStart for the driver, which records the
// supervisor's own start so it can tell it apart from a reused PID.
func ProcessStart(pid int) (uint64, error) { return processStart(pid) }

// writeGroups replaces the records at path atomically: the driver may read
// them at any moment.
func writeGroups(path string, groups []ProcessGroup) error {
	b, err := json.Marshal(groups)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".groups-*")
	if err != nil {
		return fmt.Errorf("recording the ranks' process groups: %w", err)
	}
	_, werr := tmp.Write(b)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("recording the ranks' process groups: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("recording the ranks' process groups: %w", err)
	}
	return nil
}

// ReadGroups reads the records a supervisor wrote to path; none when the
// file does not exist. The driver kills what they name, so they count only
// when the file is what the supervisor wrote: a regular file of the
// reader's own user (the supervisor runs as the driver's user), never a
// symlink or a file a task's user put there.
func ReadGroups(path string) ([]ProcessGroup, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the ranks' process groups: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("reading the ranks' process groups: %w", err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !fi.Mode().IsRegular() || !ok || int(st.Uid) != os.Geteuid() {
		return nil, fmt.Errorf("%s is not the supervisor's (not a regular file of UID %d): ignoring it", path, os.Geteuid())
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("reading the ranks' process groups: %w", err)
	}
	var groups []ProcessGroup
	if err := json.Unmarshal(b, &groups); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", path, err)
	}
	return groups, nil
}

// ours reports whether process group g is still the rank's and still has a
// member. While the leader lives, its start time proves it is the rank.
// Once the leader is gone its PID cannot be handed out again while a
// process is in the group (Linux does not reuse a PID that is a live group's
// ID), so a group that still exists is the rank's leftover children.
func (g ProcessGroup) ours() bool {
	if start, err := processStart(g.PGID); err == nil {
		return start == g.StartTicks
	}
	return syscall.Kill(-g.PGID, 0) == nil
}

// KillGroups SIGKILLs every recorded group that is still the rank's and
// returns the IDs it killed. The driver calls it once the supervisor is
// gone: nothing else would stop those processes.
func KillGroups(path string) ([]int, error) {
	groups, err := ReadGroups(path)
	if err != nil {
		return nil, err
	}
	var killed []int
	var errs []error
	for _, g := range groups {
		if g.PGID <= 1 || !g.ours() {
			continue
		}
		if err := syscall.Kill(-g.PGID, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("killing process group %d: %w", g.PGID, err))
			continue
		}
		killed = append(killed, g.PGID)
	}
	return killed, errors.Join(errs...)
}
