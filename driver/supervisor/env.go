package supervisor

import (
	"net"
	"sort"
	"strconv"
	"strings"
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
	"GPUJOB_RANK", "GPUJOB_LOCAL_RANK", "GPUJOB_WORLD_SIZE", "GPUJOB_LOCAL_WORLD_SIZE",
	"GPUJOB_NODE_RANK", "GPUJOB_NNODES", "GPUJOB_MASTER_ADDR", "GPUJOB_MASTER_PORT",
	"GPUJOB_RESTART_COUNT", "GPUJOB_MAX_RESTARTS", "GPUJOB_RUN_ID", "GPUJOB_GENERATION",
	"GPUJOB_CHECKPOINT_DIR",
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
		"RANK":             itoa(rank),
		"LOCAL_RANK":       itoa(localRank),
		"WORLD_SIZE":       itoa(p.WorldSize),
		"LOCAL_WORLD_SIZE": itoa(s.NProcPerNode),
		"NODE_RANK":        itoa(p.NodeRank),
		"NNODES":           itoa(p.NNodes),
		"MASTER_ADDR":      host,
		"MASTER_PORT":      port,
		"RESTART_COUNT":    itoa(p.Restarts),
		"MAX_RESTARTS":     itoa(s.MaxRestarts),
		"RUN_ID":           s.RunID,
		"GENERATION":       itoa(p.Round),
		"CHECKPOINT_DIR":   s.CheckpointDir,
	}
	for k, v := range gpujob {
		env["GPUJOB_"+k] = v
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
