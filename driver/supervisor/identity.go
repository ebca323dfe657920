package supervisor

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Credential is the user a task's ranks run as. The supervisor itself keeps
// the identity the executor gave it (root on a root client), like Nomad's
// executor: it holds the Consul token and client key, and writes the files
// the driver acts on (rank process groups), none of which the ranks may
// read or forge. Every process of the job's command runs as the credential.
type Credential struct {
	User   string   `json:"user"`
	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups,omitempty"` // supplementary groups, the primary one included
	// Home is the user's home directory; empty when it has none that exists
	// (nobody's /nonexistent), and the task's local directory serves.
	Home string `json:"home,omitempty"`
}

// sys is the credential for exec.Cmd. Groups are set explicitly, never
// inherited from the supervisor (root's groups would leak into the task).
func (c *Credential) sys() *syscall.Credential {
	groups := c.Groups
	if len(groups) == 0 {
		groups = []uint32{c.GID}
	}
	return &syscall.Credential{Uid: c.UID, Gid: c.GID, Groups: groups}
}

// identityEnv is what a process running as c must not inherit from the
// Nomad client's environment (Nomad passes the client's HOME, USER and
// LOGNAME on to tasks that have no filesystem isolation): HOME is c's home,
// else the task's local directory (NOMAD_TASK_DIR), so that Python
// packages that cache under ~ (torch, matplotlib, pip) have somewhere
// writable.
func (c *Credential) identityEnv(env map[string]string) {
	home := c.Home
	if home == "" {
		home = env["NOMAD_TASK_DIR"]
	}
	if home != "" {
		env["HOME"] = home
	} else {
		delete(env, "HOME")
	}
	env["USER"] = c.User
	env["LOGNAME"] = c.User
	// The client's runtime directory (/run/user/0) is not the user's.
	delete(env, "XDG_RUNTIME_DIR")
}

// RunAsCommand is the argument that makes the plugin binary run a command
// in a task: `nomad alloc exec` and script checks go through Nomad's
// executor, which runs them as the supervisor's identity and with the
// supervisor's environment (RootEnv), so the driver has them start here,
// take the task's environment from its spec and drop to the task's user
// before anything of the task's runs.
const RunAsCommand = "run-as"

// RunAsArgs are the arguments after RunAsCommand that run argv in the task
// whose supervisor spec is at specPath (a file of the driver's state
// directory, root's alone).
func RunAsArgs(specPath string, argv []string) []string {
	return append([]string{"--spec", specPath, "--"}, argv...)
}

// RunAsArgs are the arguments after RunAsCommand that run argv as c with
// the helper's own environment: for a task started by a driver that kept
// no spec path in its state (one older than the spec's TaskEnv).
func (c *Credential) RunAsArgs(argv []string) []string {
	groups := make([]string, len(c.Groups))
	for i, g := range c.Groups {
		groups[i] = strconv.FormatUint(uint64(g), 10)
	}
	args := []string{
		"--user", c.User,
		"--uid", strconv.FormatUint(uint64(c.UID), 10),
		"--gid", strconv.FormatUint(uint64(c.GID), 10),
		"--groups", strings.Join(groups, ","),
		"--home", c.Home,
		"--",
	}
	return append(args, argv...)
}

// runAs is what the run-as arguments say: a spec, or a credential.
type runAs struct {
	spec string
	cred *Credential
	argv []string
}

// parseRunAs reads what RunAsArgs wrote.
func parseRunAs(args []string) (*runAs, error) {
	r := &runAs{}
	c := &Credential{}
	for len(args) > 0 {
		flag := args[0]
		if flag == "--" {
			if len(args) < 2 {
				return nil, fmt.Errorf("%s: no command", RunAsCommand)
			}
			if r.spec == "" {
				r.cred = c
			}
			r.argv = args[1:]
			return r, nil
		}
		if len(args) < 2 {
			return nil, fmt.Errorf("%s: %s needs a value", RunAsCommand, flag)
		}
		v := args[1]
		args = args[2:]
		var err error
		switch flag {
		case "--spec":
			r.spec = v
		case "--user":
			c.User = v
		case "--home":
			c.Home = v
		case "--uid":
			c.UID, err = parseID(v)
		case "--gid":
			c.GID, err = parseID(v)
		case "--groups":
			for _, s := range strings.Split(v, ",") {
				if s == "" {
					continue
				}
				g, gerr := parseID(s)
				if gerr != nil {
					err = gerr
					break
				}
				c.Groups = append(c.Groups, g)
			}
		default:
			return nil, fmt.Errorf("%s: unknown flag %s", RunAsCommand, flag)
		}
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", RunAsCommand, flag, err)
		}
	}
	return nil, fmt.Errorf("%s: missing -- before the command", RunAsCommand)
}

func parseID(s string) (uint32, error) {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("%q is not a user or group ID", s)
	}
	return uint32(n), nil
}

// RunAsMain runs the command the arguments name in the task, in place: its
// exit status, terminal and signals are the command's. With a spec, the
// command gets the task's environment (ExecEnv) and runs as the ranks' user
// (none: the helper's own, on a client that is not root); with a bare
// credential (a task of an older driver), the helper's environment. It
// returns only on failure.
func RunAsMain(args []string) int {
	r, err := parseRunAs(args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpujob: %v\n", err)
		return 1
	}
	env, cred := os.Environ(), r.cred
	if r.spec != "" {
		s, err := ReadSpec(r.spec)
		if err != nil {
			fmt.Fprintf(os.Stderr, "gpujob: %v\n", err)
			return 1
		}
		env = ExecEnv(BaseEnv(s, nil, func() {}), s)
		cred = s.RunAs
	} else {
		m := map[string]string{}
		for _, kv := range env {
			if k, v, ok := strings.Cut(kv, "="); ok && !withheld[k] {
				m[k] = v
			}
		}
		cred.identityEnv(m)
		env = envList(m)
	}
	// Looked up in the task's PATH, before dropping privileges: the
	// command is still executed as the user, who needs the right to.
	path, err := CommandPath(r.argv[0], env)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpujob: %v\n", err)
		return 127
	}
	if cred != nil {
		if err := dropTo(cred); err != nil {
			fmt.Fprintf(os.Stderr, "gpujob: running %s as %s: %v\n", r.argv[0], cred.User, err)
			return 1
		}
	}
	err = syscall.Exec(path, r.argv, env)
	fmt.Fprintf(os.Stderr, "gpujob: executing %s: %v\n", r.argv[0], err)
	return 126
}

// dropTo switches every thread of this process to c for good (Go applies
// set*id to all threads).
func dropTo(c *Credential) error {
	groups := make([]int, 0, len(c.Groups))
	for _, g := range c.sys().Groups {
		groups = append(groups, int(g))
	}
	if err := syscall.Setgroups(groups); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setresgid(int(c.GID), int(c.GID), int(c.GID)); err != nil {
		return fmt.Errorf("setresgid: %w", err)
	}
	if err := syscall.Setresuid(int(c.UID), int(c.UID), int(c.UID)); err != nil {
		return fmt.Errorf("setresuid: %w", err)
	}
	return nil
}

func envList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out
}
