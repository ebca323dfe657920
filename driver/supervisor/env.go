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

// WorkerEnv is the environment of local worker localRank: the task's
// environment, the task config's env, then torchrun's variables (so an
// unmodified init_method="env://" script works) and their GPUJOB_
// equivalents. Later sources win, except that an OMP_NUM_THREADS the user
// set is kept.
func WorkerEnv(base []string, s *Spec, p Placement, localRank int) []string {
	env := map[string]string{}
	for _, kv := range base {
		if k, v, ok := strings.Cut(kv, "="); ok && !withheld[k] {
			env[k] = v
		}
	}
	for k, v := range s.Env {
		env[k] = v
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
