package driver

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// Nomad adds the client agent's own environment to the environment of every
// task whose driver has no filesystem isolation (taskenv.SetHostEnvvars),
// under the job's variables; a container's driver gets none of it. Left
// alone, a host member's ranks would see whatever the agent was started
// with and a container member's would not: the same job would run with
// other BLAS kernels (OPENBLAS_CORETYPE), another locale or the agent's
// credentials depending on where it lands. The gpujob driver decides
// instead: of the agent's variables, only those the plugin option host_env
// names reach the ranks, on the host and in a container alike, and only
// where nothing closer to the job (the job's env, the task config's env, the
// image) sets them.

// defaultHostEnv is host_env's default: what a process needs of the machine
// to run at all (PATH) and to speak its language; nothing that could carry
// a secret or change numerics.
var defaultHostEnv = []string{"PATH", "LANG", "LANGUAGE", "LC_*", "TZ"}

// hostEnvPattern is one host_env entry: a variable name, or a prefix
// followed by "*".
var hostEnvPattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*\*?$|^\*$`)

// hostEnvPolicy is the parsed host_env.
type hostEnvPolicy []string

// parseHostEnv checks host_env's entries, naming the one at fault.
func parseHostEnv(entries []string) (hostEnvPolicy, error) {
	for _, e := range entries {
		if !hostEnvPattern.MatchString(e) {
			return nil, fmt.Errorf("host_env: %q is neither a variable name nor a prefix followed by * (e.g. \"OPENBLAS_*\")", e)
		}
	}
	return hostEnvPolicy(entries), nil
}

// agentSecrets are the agent's variables that never reach the ranks,
// whatever host_env says: Nomad's own default env.denylist, and the tokens
// of the agents themselves.
var agentSecrets = map[string]bool{
	"CONSUL_TOKEN": true, "CONSUL_HTTP_TOKEN": true, "VAULT_TOKEN": true, "NOMAD_TOKEN": true, "NOMAD_LICENSE": true,
	"AWS_ACCESS_KEY_ID": true, "AWS_SECRET_ACCESS_KEY": true, "AWS_SESSION_TOKEN": true, "GOOGLE_APPLICATION_CREDENTIALS": true,
}

// allows reports whether the agent's variable name may reach the ranks.
func (p hostEnvPolicy) allows(name string) bool {
	if agentSecrets[name] {
		return false
	}
	for _, e := range p {
		if prefix, glob := strings.CutSuffix(e, "*"); glob && strings.HasPrefix(name, prefix) || e == name {
			return true
		}
	}
	return false
}

// environMap turns KEY=VALUE entries into a map (a later entry wins).
func environMap(environ []string) map[string]string {
	out := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			out[k] = v
		}
	}
	return out
}

// taskEnvList is a host member's task environment without the agent's
// variables that host_env does not name. A variable counts as the agent's
// when the agent has it with the same value: Nomad merged them, so that is
// all there is to tell them apart by. A job that sets a variable to exactly
// the agent's value in the task's env block therefore loses it unless
// host_env names it; the task config's env (where `gpujob render` puts a
// spec's env) is applied later by the supervisor and always reaches the
// ranks.
func taskEnvList(env, agent map[string]string, p hostEnvPolicy) []string {
	out := make([]string, 0, len(env))
	for k, v := range env {
		if av, ok := agent[k]; ok && av == v && !p.allows(k) {
			continue
		}
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// allowedAgentEnv is the part of the agent's environment host_env lets
// through: what a container member's ranks get where neither the job nor
// the image sets the variable.
func allowedAgentEnv(agent map[string]string, p hostEnvPolicy) map[string]string {
	out := map[string]string{}
	for k, v := range agent {
		if p.allows(k) {
			out[k] = v
		}
	}
	return out
}

// agentEnviron is the Nomad agent's environment as the plugin inherited it:
// the plugin's own, less the handshake variables go-plugin adds.
func agentEnviron(environ []string) map[string]string {
	env := environMap(environ)
	for _, k := range []string{"NOMAD_PLUGIN_MAGIC_COOKIE", "PLUGIN_MIN_PORT", "PLUGIN_MAX_PORT", "PLUGIN_PROTOCOL_VERSIONS"} {
		delete(env, k)
	}
	return env
}
