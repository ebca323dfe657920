package driver

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/nomad/plugins/shared/hclspec"

	"github.com/gpujob/gpujob/driver/rendezvous"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

// defaultPidsLimit is pids_limit's default: room for a member's ranks with
// their threads and DataLoader workers many times over, and an eighth of
// the machine's PIDs where pid_max is the common 32768, so that one task's
// fork bomb leaves the others theirs.
const (
	defaultPidsLimit = 4096
	minPidsLimit     = 64
)

// configSpec is the agent's plugin "nomad-driver-gpujob" { config { ... } }.
var configSpec = hclspec.NewObject(map[string]*hclspec.Spec{
	"consul": hclspec.NewBlock("consul", false, hclspec.NewObject(map[string]*hclspec.Spec{
		"address":    hclspec.NewAttr("address", "string", false),
		"token":      hclspec.NewAttr("token", "string", false),
		"datacenter": hclspec.NewAttr("datacenter", "string", false),
		"ca_file":    hclspec.NewAttr("ca_file", "string", false),
		"cert_file":  hclspec.NewAttr("cert_file", "string", false),
		"key_file":   hclspec.NewAttr("key_file", "string", false),
	})),
	"key_prefix": hclspec.NewDefault(hclspec.NewAttr("key_prefix", "string", false),
		hclspec.NewLiteral(`"gpujob/rendezvous"`)),
	// Where sweeps keep their records (package sweepkv); a trial's
	// supervisor writes its metrics and reads its stop request there. It
	// must match the CLI's and the sweep controller's.
	"sweep_key_prefix": hclspec.NewDefault(hclspec.NewAttr("sweep_key_prefix", "string", false),
		hclspec.NewLiteral(`"`+sweepkv.DefaultPrefix+`"`)),
	"session_ttl": hclspec.NewDefault(hclspec.NewAttr("session_ttl", "string", false),
		hclspec.NewLiteral(`"10s"`)),
	"checkpoint_root": hclspec.NewDefault(hclspec.NewAttr("checkpoint_root", "string", false),
		hclspec.NewLiteral(`"`+contract.DefaultCheckpointRoot+`"`)),
	// Who a task's ranks run as when the task names no user. Root, by any
	// of these roads, needs allow_root (see resolveIdentity).
	"default_user": hclspec.NewDefault(hclspec.NewAttr("default_user", "string", false),
		hclspec.NewLiteral(`"nobody"`)),
	"allow_root": hclspec.NewDefault(hclspec.NewAttr("allow_root", "bool", false),
		hclspec.NewLiteral("false")),
	// The users a task may run as (identity.go): allowed_users for every
	// namespace, namespace_users instead for the namespaces it lists.
	"allowed_users": hclspec.NewDefault(hclspec.NewAttr("allowed_users", "list(string)", false),
		hclspec.NewLiteral(`["nobody"]`)),
	// A map in the agent's HCL1 config reaches the plugin as a list of maps
	// (as the task config's env does).
	"namespace_users": hclspec.NewAttr("namespace_users", "list(map(list(string)))", false),
	// The most processes and threads one task may have (pids.go); 0: no
	// limit.
	"pids_limit": hclspec.NewDefault(hclspec.NewAttr("pids_limit", "number", false),
		hclspec.NewLiteral(strconv.Itoa(defaultPidsLimit))),
	// The static supervisor (bin/gpujob-supervisor) that container members
	// run; kept out of plugin_dir, where Nomad would take it for a plugin.
	"container_supervisor": hclspec.NewDefault(hclspec.NewAttr("container_supervisor", "string", false),
		hclspec.NewLiteral(`"/usr/local/lib/gpujob/gpujob-supervisor"`)),
	// Which of the Nomad agent's own environment variables reach the ranks
	// (hostenv.go): names, or prefixes ending in *.
	"host_env": hclspec.NewDefault(hclspec.NewAttr("host_env", "list(string)", false),
		hclspec.NewLiteral(hclList(defaultHostEnv))),
})

// hclList writes a list of strings as an HCL literal.
func hclList(items []string) string {
	quoted := make([]string, len(items))
	for i, s := range items {
		quoted[i] = strconv.Quote(s)
	}
	return "[" + strings.Join(quoted, ", ") + "]"
}

// taskConfigSpec is a job's task "..." { driver = "gpujob" config { ... } }.
var taskConfigSpec = hclspec.NewObject(map[string]*hclspec.Spec{
	"command":        hclspec.NewAttr("command", "string", true),
	"args":           hclspec.NewAttr("args", "list(string)", false),
	"nproc_per_node": hclspec.NewAttr("nproc_per_node", "number", false),
	"rendezvous": hclspec.NewBlock("rendezvous", false, hclspec.NewObject(map[string]*hclspec.Spec{
		"nnodes":       hclspec.NewAttr("nnodes", "string", false),
		"join_timeout": hclspec.NewAttr("join_timeout", "string", false),
		"last_call":    hclspec.NewAttr("last_call", "string", false),
		"port":         hclspec.NewAttr("port", "string", false),
	})),
	"max_restarts": hclspec.NewDefault(hclspec.NewAttr("max_restarts", "number", false), hclspec.NewLiteral("3")),
	"log_prefix":   hclspec.NewAttr("log_prefix", "bool", false),
	"workdir":      hclspec.NewAttr("workdir", "string", false),
	// Python modules a preloaded interpreter imports once per local rank
	// slot, so that ranks restart by a fork (supervisor/zygote.go).
	"preload": hclspec.NewAttr("preload", "list(string)", false),
	// A map in a task config reaches the driver as a list of maps (Nomad's
	// JSON job form), as for docker's labels and sysctl.
	"env": hclspec.NewAttr("env", "list(map(string))", false),
	// A container member (container.go): the group's docker task that runs
	// the supervisor, and the checkpoint root its mounts were rendered for.
	"container_task":  hclspec.NewAttr("container_task", "string", false),
	"checkpoint_root": hclspec.NewAttr("checkpoint_root", "string", false),
	// The docker task's kill_timeout, which the supervisor in the
	// container plans its stop by (container.go).
	"container_kill_timeout": hclspec.NewAttr("container_kill_timeout", "string", false),
	// A sweep's trial (both or neither): its supervisor reports rank 0's
	// metric lines and obeys the trial's stop request (supervisor/trial.go).
	"sweep": hclspec.NewAttr("sweep", "string", false),
	"trial": hclspec.NewAttr("trial", "string", false),
	// A service replica: one process on its own, no rendezvous, no
	// Consul; Nomad restarts it and Consul checks it (spec.go).
	"service": hclspec.NewAttr("service", "bool", false),
})

// Config is the decoded plugin configuration.
type Config struct {
	Consul         *ConsulConfig `codec:"consul"`
	KeyPrefix      string        `codec:"key_prefix"`
	SweepKeyPrefix string        `codec:"sweep_key_prefix"`
	SessionTTL     string        `codec:"session_ttl"`
	CheckpointRoot string        `codec:"checkpoint_root"`
	DefaultUser    string        `codec:"default_user"`
	AllowRoot      bool          `codec:"allow_root"`
	// AllowedUsers and NamespaceUsers say who tasks may run as
	// (identity.go).
	AllowedUsers      []string              `codec:"allowed_users"`
	NamespaceUsersRaw []map[string][]string `codec:"namespace_users"`
	NamespaceUsers    map[string][]string   // NamespaceUsersRaw merged, by validate
	// PidsLimit caps each task's processes and threads; 0: none.
	PidsLimit int `codec:"pids_limit"`
	// ContainerSupervisor is the static supervisor binary the driver copies
	// into a container member's run directory.
	ContainerSupervisor string `codec:"container_supervisor"`
	// HostEnv names the agent's variables that reach the ranks (hostenv.go).
	HostEnv []string `codec:"host_env"`

	hostEnv hostEnvPolicy // HostEnv, checked by validate
}

// ConsulConfig says how the supervisors reach Consul. Empty fields fall back
// to the CONSUL_HTTP_* environment of the Nomad client.
type ConsulConfig struct {
	Address    string `codec:"address"`
	Token      string `codec:"token"`
	Datacenter string `codec:"datacenter"`
	CAFile     string `codec:"ca_file"`
	CertFile   string `codec:"cert_file"`
	KeyFile    string `codec:"key_file"`
}

// TaskConfig is the decoded task configuration.
type TaskConfig struct {
	Command      string              `codec:"command"`
	Args         []string            `codec:"args"`
	NProcPerNode int                 `codec:"nproc_per_node"`
	Rendezvous   *RendezvousConfig   `codec:"rendezvous"`
	MaxRestarts  int                 `codec:"max_restarts"`
	LogPrefix    *bool               `codec:"log_prefix"`
	Workdir      string              `codec:"workdir"`
	Preload      []string            `codec:"preload"`
	Env          []map[string]string `codec:"env"`
	// ContainerTask makes the task a container member's sidecar.
	ContainerTask  string `codec:"container_task"`
	CheckpointRoot string `codec:"checkpoint_root"`
	// ContainerKillTimeout is the docker task's kill_timeout (a duration).
	ContainerKillTimeout string `codec:"container_kill_timeout"`
	// Sweep and Trial make the task a trial of a sweep (reportSpec).
	Sweep string `codec:"sweep"`
	Trial string `codec:"trial"`
	// Service makes the task a service replica (buildSpec).
	Service bool `codec:"service"`
}

// envMap merges the env maps.
func (tc *TaskConfig) envMap() map[string]string {
	out := map[string]string{}
	for _, m := range tc.Env {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// RendezvousConfig is the task's rendezvous block.
type RendezvousConfig struct {
	NNodes      string `codec:"nnodes"`
	JoinTimeout string `codec:"join_timeout"`
	LastCall    string `codec:"last_call"`
	Port        string `codec:"port"`
}

// validate checks the plugin config, naming the field at fault.
func (c *Config) validate() error {
	if c.KeyPrefix == "" {
		c.KeyPrefix = "gpujob/rendezvous"
	}
	if strings.HasPrefix(c.KeyPrefix, "/") || strings.HasSuffix(c.KeyPrefix, "/") {
		return fmt.Errorf("key_prefix: %q must not start or end with /", c.KeyPrefix)
	}
	if c.SweepKeyPrefix == "" {
		c.SweepKeyPrefix = sweepkv.DefaultPrefix
	}
	if strings.HasPrefix(c.SweepKeyPrefix, "/") || strings.HasSuffix(c.SweepKeyPrefix, "/") {
		return fmt.Errorf("sweep_key_prefix: %q must not start or end with /", c.SweepKeyPrefix)
	}
	// The two trees must not overlap: the rendezvous deletes what it
	// takes for a dead run of <prefix>/<namespace>/<job>/, which in a
	// shared tree could be a sweep's records.
	if a, b := c.KeyPrefix+"/", c.SweepKeyPrefix+"/"; strings.HasPrefix(a, b) || strings.HasPrefix(b, a) {
		return fmt.Errorf("sweep_key_prefix: %q overlaps key_prefix %q; the sweeps' records and the rendezvous need trees of their own", c.SweepKeyPrefix, c.KeyPrefix)
	}
	if c.SessionTTL == "" {
		c.SessionTTL = "10s"
	}
	ttl, err := time.ParseDuration(c.SessionTTL)
	if err != nil {
		return fmt.Errorf("session_ttl: %q is not a duration: %w", c.SessionTTL, err)
	}
	// Consul refuses session TTLs outside 10s..24h.
	if ttl < 10*time.Second || ttl > 24*time.Hour {
		return fmt.Errorf("session_ttl: %s is outside Consul's 10s to 24h", ttl)
	}
	if c.CheckpointRoot == "" {
		c.CheckpointRoot = contract.DefaultCheckpointRoot
	}
	if !strings.HasPrefix(c.CheckpointRoot, "/") {
		return fmt.Errorf("checkpoint_root: %q must be an absolute path", c.CheckpointRoot)
	}
	if c.ContainerSupervisor == "" {
		c.ContainerSupervisor = "/usr/local/lib/gpujob/gpujob-supervisor"
	}
	if !strings.HasPrefix(c.ContainerSupervisor, "/") {
		return fmt.Errorf("container_supervisor: %q must be an absolute path", c.ContainerSupervisor)
	}
	if c.DefaultUser == "" {
		c.DefaultUser = defaultUser
	}
	if c.DefaultUser == "root" && !c.AllowRoot {
		return fmt.Errorf("default_user: \"root\" needs allow_root = true (the gpujob driver runs tasks as root only when the agent config says so)")
	}
	if err := c.validateUsers(); err != nil {
		return err
	}
	if c.PidsLimit < 0 || c.PidsLimit > 0 && c.PidsLimit < minPidsLimit {
		return fmt.Errorf("pids_limit: %d leaves a task too few processes and threads (a Python rank alone runs dozens of threads): "+
			"use %d or more, or 0 for no limit", c.PidsLimit, minPidsLimit)
	}
	// nil is no host_env at all (host_env = [] decodes to an empty list,
	// which lets nothing through).
	if c.HostEnv == nil {
		c.HostEnv = defaultHostEnv
	}
	if c.hostEnv, err = parseHostEnv(c.HostEnv); err != nil {
		return err
	}
	if c.Consul == nil {
		c.Consul = &ConsulConfig{}
	}
	tls := []string{c.Consul.CAFile, c.Consul.CertFile, c.Consul.KeyFile}
	if (tls[1] == "") != (tls[2] == "") {
		return fmt.Errorf("consul: cert_file and key_file go together (got cert_file %q, key_file %q)", tls[1], tls[2])
	}
	return nil
}

// nnodes parses "4" or "2:4" into min and max.
func parseNNodes(s string) (min, max int, err error) {
	if s == "" {
		return 1, 1, nil
	}
	lo, hi, ranged := strings.Cut(s, ":")
	if min, err = strconv.Atoi(strings.TrimSpace(lo)); err != nil {
		return 0, 0, fmt.Errorf("rendezvous.nnodes: %q is not a number or min:max", s)
	}
	max = min
	if ranged {
		if max, err = strconv.Atoi(strings.TrimSpace(hi)); err != nil {
			return 0, 0, fmt.Errorf("rendezvous.nnodes: %q is not a number or min:max", s)
		}
	}
	if min < 1 || max < min {
		return 0, 0, fmt.Errorf("rendezvous.nnodes: %q needs 1 <= min <= max", s)
	}
	// The rendezvous refuses larger groups; refusing here, before the
	// driver sizes its list of expected members by max, also keeps a typo
	// such as "2000000000" from exhausting the client's memory (found by
	// FuzzTaskConfig).
	if max > rendezvous.MaxMembers {
		return 0, 0, fmt.Errorf("rendezvous.nnodes: %q is above the limit of %d members", s, rendezvous.MaxMembers)
	}
	return min, max, nil
}

// duration parses an optional duration field, naming it on error.
func duration(field, s string, def time.Duration) (time.Duration, error) {
	if s == "" {
		return def, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s: %q is not a positive duration (try \"30s\" or \"5m\")", field, s)
	}
	return d, nil
}

// validateUsers checks allowed_users and namespace_users: no gpujob service
// account, no empty namespace list, and a default_user that is allowed.
func (c *Config) validateUsers() error {
	if c.AllowedUsers == nil {
		c.AllowedUsers = []string{defaultUser}
	}
	check := func(option string, users []string) error {
		for _, u := range users {
			if u == "" {
				return fmt.Errorf("%s: an empty user name", option)
			}
			if isServiceAccount(u) {
				return fmt.Errorf("%s: %q is one of gpujob's own service accounts (gpujob-*), which no task may run as", option, u)
			}
		}
		return nil
	}
	if err := check("allowed_users", c.AllowedUsers); err != nil {
		return err
	}
	if c.NamespaceUsers == nil {
		c.NamespaceUsers = map[string][]string{}
		for _, m := range c.NamespaceUsersRaw {
			maps.Copy(c.NamespaceUsers, m)
		}
	}
	for ns, users := range c.NamespaceUsers {
		option := fmt.Sprintf("namespace_users[%q]", ns)
		if len(users) == 0 {
			return fmt.Errorf("%s: an empty list would refuse every task of the namespace; list its users, or leave the namespace out to use allowed_users", option)
		}
		if err := check(option, users); err != nil {
			return err
		}
	}
	if c.DefaultUser != "root" && !slices.Contains(c.AllowedUsers, c.DefaultUser) {
		return fmt.Errorf("default_user: %q is not in allowed_users %q; tasks without a user would all be refused", c.DefaultUser, c.AllowedUsers)
	}
	return nil
}
