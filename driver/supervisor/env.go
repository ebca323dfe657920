package supervisor

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/gpujob/gpujob/internal/contract"
)

// Placement is where one member stands in a complete round.
type Placement struct {
	Round      int // generation, 1-based
	Restarts   int
	NodeRank   int
	NNodes     int
	RankOffset int // global rank of this member's local rank 0
	WorldSize  int
	MasterAddr string // host:port of node rank 0
}

// withheld are variables of the supervisor's own environment that worker
// processes must not inherit.
var withheld = map[string]bool{"CONSUL_HTTP_TOKEN": true, "NOMAD_TOKEN": true}

// roundVariables are the variables WorkerEnv sets that change with the
// round (or name it): a preloaded interpreter starts without them
// (zygoteEnv), and its ranks get them when forked.
var roundVariables = []string{
	"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
	"ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
	"TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
	contract.EnvRank, contract.EnvLocalRank, contract.EnvWorldSize, contract.EnvLocalWorldSize,
	contract.EnvNodeRank, contract.EnvNNodes, contract.EnvMasterAddr, contract.EnvMasterPort,
	contract.EnvRestartCount, contract.EnvMaxRestarts, contract.EnvRunID, contract.EnvGeneration,
	contract.EnvCheckpointDir,
}

// WorkerEnv is the environment of local worker localRank: the agent's
// variables the driver lets through (HostEnv), the task's environment, the
// task config's env, then torchrun's variables (so an
// unmodified init_method="env://" script works) and their GPUJOB_
// equivalents. Later sources win, except that an OMP_NUM_THREADS the user
// set is kept, and the task's user (HOME, USER, LOGNAME) and GPU
// reservation (CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES) replace what
// the Nomad client's environment says.
func WorkerEnv(base []string, s *Spec, p Placement, localRank int) []string {
	env := map[string]string{}
	for k, v := range s.HostEnv {
		env[k] = v
	}
	for _, kv := range base {
		if k, v, ok := strings.Cut(kv, "="); ok && !withheld[k] {
			env[k] = v
		}
	}
	if s.RunAs != nil {
		s.RunAs.identityEnv(env)
	}
	for k, v := range s.Env {
		env[k] = v
	}
	// The GPUs reserved to the task, whatever the task config's env says: a
	// job must not pick other jobs' GPUs by naming them. All of the task's
	// ranks see all of its GPUs, as under torchrun (rank i takes
	// cuda:LOCAL_RANK).
	if s.VisibleDevices != nil {
		env["CUDA_VISIBLE_DEVICES"] = *s.VisibleDevices
		env["NVIDIA_VISIBLE_DEVICES"] = *s.VisibleDevices
	}
	host, port, err := net.SplitHostPort(p.MasterAddr)
	if err != nil {
		host, port = p.MasterAddr, ""
	}
	rank := p.RankOffset + localRank
	itoa := strconv.Itoa
	set := map[string]string{
		"RANK":                       itoa(rank),
		"LOCAL_RANK":                 itoa(localRank),
		"WORLD_SIZE":                 itoa(p.WorldSize),
		"LOCAL_WORLD_SIZE":           itoa(s.NProcPerNode),
		"GROUP_RANK":                 itoa(p.NodeRank),
		"GROUP_WORLD_SIZE":           itoa(p.NNodes),
		"ROLE_RANK":                  itoa(rank),
		"ROLE_WORLD_SIZE":            itoa(p.WorldSize),
		"ROLE_NAME":                  s.RoleName,
		"MASTER_ADDR":                host,
		"MASTER_PORT":                port,
		"TORCHELASTIC_RESTART_COUNT": itoa(p.Restarts),
		"TORCHELASTIC_MAX_RESTARTS":  itoa(s.MaxRestarts),
		"TORCHELASTIC_RUN_ID":        s.RunID,
	}
	for k, v := range set {
		env[k] = v
	}
	gpujob := map[string]string{
		contract.EnvRank:           itoa(rank),
		contract.EnvLocalRank:      itoa(localRank),
		contract.EnvWorldSize:      itoa(p.WorldSize),
		contract.EnvLocalWorldSize: itoa(s.NProcPerNode),
		contract.EnvNodeRank:       itoa(p.NodeRank),
		contract.EnvNNodes:         itoa(p.NNodes),
		contract.EnvMasterAddr:     host,
		contract.EnvMasterPort:     port,
		contract.EnvRestartCount:   itoa(p.Restarts),
		contract.EnvMaxRestarts:    itoa(s.MaxRestarts),
		contract.EnvRunID:          s.RunID,
		contract.EnvGeneration:     itoa(p.Round),
		contract.EnvCheckpointDir:  s.CheckpointDir,
	}
	for k, v := range gpujob {
		env[k] = v
	}
	// Several processes on one node would each start a thread per core and
	// oversubscribe it; torchrun sets 1 for the same reason.
	if _, set := env["OMP_NUM_THREADS"]; !set && s.NProcPerNode > 1 {
		env["OMP_NUM_THREADS"] = "1"
	}

	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// RootPath is the PATH of every process of gpujob's that runs as root on a
// client: the supervisor and the run-as helper. It names only directories
// that root alone can write on any sane system.
const RootPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// RootEnv is the whole environment the driver starts the supervisor (and
// the run-as helper) with: built here from nothing, never from the task's,
// so that no variable a job controls (LD_PRELOAD for the dynamic loader,
// GODEBUG, HTTP_PROXY, CONSUL_HTTP_ADDR for the Consul client, ...) reaches
// a process that runs as root. The allocation and task name it carries are
// Nomad's own, for `ps e` and for finding the task's processes.
func RootEnv(allocID, task string) []string {
	return []string{"PATH=" + RootPath, "NOMAD_ALLOC_ID=" + allocID, "NOMAD_TASK_NAME=" + task}
}

// BaseEnv is the environment the ranks start from: the task environment the
// driver put in the spec for a host member; for a container member the
// container's own (the image's and the docker task's), which this process
// was started with and then gives up (clearOwn), so that the supervisor's
// own HTTP clients and runtime see none of it.
func BaseEnv(s *Spec, own []string, clearOwn func()) []string {
	if !s.Container {
		return s.TaskEnv
	}
	base := append([]string(nil), own...)
	clearOwn()
	return base
}

// ExecEnv is the environment of a command run in the task (`nomad alloc
// exec`, a script check): a rank's, without the variables of a round.
func ExecEnv(base []string, s *Spec) []string {
	full := WorkerEnv(base, s, Placement{}, 0)
	round := map[string]bool{}
	for _, k := range roundVariables {
		round[k] = true
	}
	out := make([]string, 0, len(full))
	for _, kv := range full {
		if k, _, _ := strings.Cut(kv, "="); !round[k] {
			out = append(out, kv)
		}
	}
	return out
}

// envValue is the value of key in env ("" when unset).
func envValue(env []string, key string) string {
	v := ""
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == key {
			v = val
		}
	}
	return v
}

// CommandPath resolves name as the process that runs it would: a name with
// a slash is itself, any other is looked up in the PATH of env (the rank's,
// not the supervisor's own RootPath). The task's user still needs the right
// to execute it: the kernel checks that when the rank starts.
func CommandPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := envValue(env, "PATH")
	for _, dir := range filepath.SplitList(path) {
		if !filepath.IsAbs(dir) {
			continue // "" and relative entries mean the working directory: never for a root-started command
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q: no executable of that name in the task's PATH %q", name, path)
}
