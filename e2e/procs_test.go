package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is one process of this machine, as /proc shows it.
type proc struct {
	pid, ppid int
	args      []string
	env       map[string]string
}

func (p proc) String() string {
	return fmt.Sprintf("pid %d (%s)", p.pid, strings.Join(p.args, " "))
}

// processes lists the live processes whose environment names one of the
// allocations (NOMAD_ALLOC_ID): every process a task started inherits it,
// the supervisor, its ranks and whatever they start, while the agents,
// executors and logmons run with the client's own environment. Allocation
// IDs are UUIDs, so another cluster on the machine never matches.
func processes(allocIDs ...string) []proc {
	want := map[string]bool{}
	for _, id := range allocIDs {
		want[id] = true
	}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var out []proc
	for _, d := range dirs {
		raw, err := os.ReadFile(filepath.Join(d, "environ"))
		if err != nil || !bytes.Contains(raw, []byte("NOMAD_ALLOC_ID=")) {
			continue
		}
		env := map[string]string{}
		for _, kv := range strings.Split(string(raw), "\x00") {
			if k, v, ok := strings.Cut(kv, "="); ok {
				env[k] = v
			}
		}
		if !want[env["NOMAD_ALLOC_ID"]] {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(d))
		ppid, zombie := procStat(pid)
		if zombie {
			continue // gone, though nobody has reaped it yet
		}
		cmdline, _ := os.ReadFile(filepath.Join(d, "cmdline"))
		out = append(out, proc{pid: pid, ppid: ppid, env: env,
			args: strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].pid < out[j].pid })
	return out
}

// procStat reads a process's parent and whether it is a zombie.
func procStat(pid int) (ppid int, zombie bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, true
	}
	// The command name is in parentheses and may hold anything.
	rest := string(b[bytes.LastIndexByte(b, ')')+2:])
	f := strings.Fields(rest)
	if len(f) < 2 {
		return 0, true
	}
	ppid, _ = strconv.Atoi(f[1])
	return ppid, f[0] == "Z"
}

// isSupervisor tells the task's supervisor: the driver binary run with
// "supervise".
func (p proc) isSupervisor() bool {
	return len(p.args) > 1 && p.args[1] == "supervise" || // the plugin binary, on the host
		len(p.args) > 0 && p.args[0] == "/gpujob/supervisor" // the static one, in a container
}

// isContainerInit tells the init of a container member's container
// (the docker task's `init = true`), which runs as root beside the
// supervisor.
func (p proc) isContainerInit() bool {
	return len(p.args) > 0 && p.args[0] == "/sbin/docker-init"
}

// isRank tells a rank's process tree (the rank and anything it started):
// the supervisor gives ranks the torchrun environment.
func (p proc) isRank() bool {
	_, ok := p.env["TORCHELASTIC_RUN_ID"]
	return ok && !p.isSupervisor()
}

// rankProcs lists the processes the supervisors of the allocations started
// as ranks (the top of each rank's process tree, not its children).
func rankProcs(allocIDs ...string) []proc {
	ps := processes(allocIDs...)
	isRank := map[int]bool{}
	for _, p := range ps {
		if p.isRank() {
			isRank[p.pid] = true
		}
	}
	var out []proc
	for _, p := range ps {
		if p.isRank() && !isRank[p.ppid] {
			out = append(out, p)
		}
	}
	return out
}

// ranks maps each global rank of the allocations to its process's PID.
func ranks(allocIDs ...string) map[int]int {
	out := map[int]int{}
	for _, p := range rankProcs(allocIDs...) {
		if r, err := strconv.Atoi(p.env["RANK"]); err == nil {
			out[r] = p.pid
		}
	}
	return out
}

// supervisorPID is the PID of an allocation's supervisor, 0 if none runs.
func supervisorPID(allocID string) int {
	for _, p := range processes(allocID) {
		if p.isSupervisor() {
			return p.pid
		}
	}
	return 0
}

// waitGone waits up to timeout for the processes to exit and returns those
// still alive then.
func waitGone(timeout time.Duration, pids ...int) []int {
	deadline := time.Now().Add(timeout)
	for {
		var alive []int
		for _, pid := range pids {
			if _, zombie := procStat(pid); !zombie {
				alive = append(alive, pid)
			}
		}
		if len(alive) == 0 || time.Now().After(deadline) {
			return alive
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// kill9 sends SIGKILL to pid.
func kill9(pid int) error {
	if pid <= 0 {
		return fmt.Errorf("no process to kill")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill -9 %d: %w", pid, err)
	}
	return nil
}
