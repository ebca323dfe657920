package supervisor

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// A preloaded interpreter (zygote) runs the job's own code: what it imports
// at preload is the job's, and so is every byte it reports. When it says
// "I forked PID n for the rank", n is a claim, and the root supervisor must
// not signal n, or n's process group, on its word: PID 1 would make a
// group kill kill(-1), every process of the machine. So before the
// supervisor keeps a forked rank it proves the claim (forkedRank): n is a
// live child of this zygote, in the zygote's cgroups, running as the ranks'
// user and leading its own process group. It holds a pidfd for n, taken
// before looking, so that n cannot turn into another process between the
// look and a signal; and it signals n's group only while the group is
// provably still the rank's (ProcessGroup.ours).

// procInfo is what forkedRank reads of a process.
type procInfo struct {
	ppid, pgrp int
	start      uint64
	uids       [2]uint32 // real, effective
	cgroups    []byte
}

// readProcInfo reads pid's parent, process group, start time, user and
// cgroups from /proc.
func readProcInfo(pid int) (procInfo, error) {
	var info procInfo
	dir := "/proc/" + strconv.Itoa(pid)
	b, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return info, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return info, fmt.Errorf("%s/stat: no command name", dir)
	}
	f := strings.Fields(string(b[i+1:]))
	// Fields after the name: state (3), ppid (4), pgrp (5), ..., starttime (22).
	if len(f) < 20 {
		return info, fmt.Errorf("%s/stat: %d fields", dir, len(f)+2)
	}
	if info.ppid, err = strconv.Atoi(f[1]); err != nil {
		return info, err
	}
	if info.pgrp, err = strconv.Atoi(f[2]); err != nil {
		return info, err
	}
	if info.start, err = strconv.ParseUint(f[19], 10, 64); err != nil {
		return info, err
	}
	status, err := os.ReadFile(dir + "/status")
	if err != nil {
		return info, err
	}
	uidsFound := false
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			ids := strings.Fields(rest)
			if len(ids) < 2 {
				break
			}
			for k := 0; k < 2; k++ {
				v, err := strconv.ParseUint(ids[k], 10, 32)
				if err != nil {
					return info, err
				}
				info.uids[k] = uint32(v)
			}
			uidsFound = true
		}
	}
	if !uidsFound {
		return info, fmt.Errorf("%s/status: no Uid line", dir)
	}
	info.cgroups, err = os.ReadFile(dir + "/cgroup")
	return info, err
}

// forkedRank checks a zygote's report that it forked pid, and returns a
// pidfd for the rank and its process group; zygotePID is the zygote's and
// uid the user its ranks run as. An error says which check failed, for the
// task's events.
func forkedRank(pid, zygotePID int, uid uint32) (pidfd int, group ProcessGroup, err error) {
	if pid <= 1 || pid == zygotePID || pid == os.Getpid() {
		return -1, ProcessGroup{}, fmt.Errorf("the preloaded interpreter reported process %d as the rank it forked, which cannot be", pid)
	}
	pidfd, err = unix.PidfdOpen(pid, 0)
	if err != nil {
		return -1, ProcessGroup{}, fmt.Errorf("the preloaded interpreter reported process %d as the rank it forked: %w", pid, err)
	}
	fail := func(format string, args ...any) (int, ProcessGroup, error) {
		unix.Close(pidfd)
		return -1, ProcessGroup{}, fmt.Errorf("the preloaded interpreter reported process %d as the rank it forked, but "+format, append([]any{pid}, args...)...)
	}
	info, err := readProcInfo(pid)
	if err != nil {
		return fail("it cannot be read: %v", err)
	}
	zyg, err := readProcInfo(zygotePID)
	if err != nil {
		return fail("the interpreter itself cannot be read: %v", err)
	}
	// Only now is it certain that what was read is pid's own: the pidfd
	// was taken before, and the process it names is still alive, so the
	// PID was not handed to another process in between.
	if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err != nil {
		return fail("it is gone (%v)", err)
	}
	switch {
	case info.ppid != zygotePID:
		return fail("its parent is process %d, not the interpreter (%d)", info.ppid, zygotePID)
	case info.uids[0] != uid || info.uids[1] != uid:
		return fail("it runs as UID %d/%d, not the ranks' %d", info.uids[0], info.uids[1], uid)
	case info.pgrp != pid:
		return fail("it does not lead its own process group (its group is %d)", info.pgrp)
	case !bytes.Equal(info.cgroups, zyg.cgroups):
		return fail("its cgroups are not the interpreter's")
	}
	return pidfd, ProcessGroup{PGID: pid, StartTicks: info.start}, nil
}

// signalPidfd signals the process of a pidfd; a process that is gone is no
// error.
func signalPidfd(pidfd int, sig syscall.Signal) error {
	err := unix.PidfdSendSignal(pidfd, sig, nil, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	return err
}
