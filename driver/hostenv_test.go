package driver

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/gpujob/gpujob/driver/supervisor"
)

func TestPluginConfigHostEnv(t *testing.T) {
	cases := []struct {
		name    string
		body    string
		want    []string
		wantErr string
	}{
		{"default", ``, defaultHostEnv, ""},
		{"names and prefixes", `host_env = ["PATH", "OPENBLAS_*", "LD_LIBRARY_PATH"]`, []string{"PATH", "OPENBLAS_*", "LD_LIBRARY_PATH"}, ""},
		{"nothing at all", `host_env = []`, []string{}, ""},
		{"everything", `host_env = ["*"]`, []string{"*"}, ""},
		{"a star inside a name", `host_env = ["OPEN*BLAS"]`, nil, `host_env: "OPEN*BLAS" is neither a variable name nor a prefix`},
		{"an assignment", `host_env = ["A=1"]`, nil, `host_env: "A=1"`},
		{"not a list", `host_env = "PATH"`, nil, "host_env"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := decodePluginConfig(t, c.body)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(cfg.HostEnv, c.want) || !slices.Equal([]string(cfg.hostEnv), c.want) {
				t.Errorf("host_env %q (parsed %q), want %q", cfg.HostEnv, cfg.hostEnv, c.want)
			}
		})
	}
}

func TestHostEnvPolicyAllows(t *testing.T) {
	p := hostEnvPolicy(defaultHostEnv)
	for name, want := range map[string]bool{
		"PATH": true, "LANG": true, "LC_ALL": true, "LC_NUMERIC": true, "TZ": true,
		"PATHX": false, "LC": false, "OPENBLAS_CORETYPE": false, "HOME": false, "LD_PRELOAD": false,
	} {
		if got := p.allows(name); got != want {
			t.Errorf("default host_env allows %s: %t, want %t", name, got, want)
		}
	}
	all := hostEnvPolicy{"*"}
	if !all.allows("OPENBLAS_CORETYPE") || !all.allows("X") {
		t.Errorf(`host_env ["*"] refuses an ordinary variable`)
	}
	// The agents' and clouds' credentials never pass, even when named.
	for _, secret := range []string{"NOMAD_TOKEN", "CONSUL_HTTP_TOKEN", "VAULT_TOKEN", "AWS_SECRET_ACCESS_KEY"} {
		if all.allows(secret) || (hostEnvPolicy{secret}).allows(secret) {
			t.Errorf("host_env lets the agent's %s through", secret)
		}
	}
}

func TestTaskEnvListDropsTheAgentsVariables(t *testing.T) {
	agent := map[string]string{
		"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "512",
		"HOME": "/root", "SSH_AUTH_SOCK": "/tmp/agent.sock", "SHARED": "same",
	}
	task := map[string]string{
		// Nomad merged these from the agent.
		"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "512",
		"HOME": "/root", "SSH_AUTH_SOCK": "/tmp/agent.sock",
		// The job's own, and one it set to another value than the agent's.
		"NOMAD_ALLOC_ID": "a1", "MY_FLAG": "1", "OPENBLAS_NUM_THREADS": "2",
		// The job set this to the agent's value: it cannot be told apart.
		"SHARED": "same",
	}
	cases := []struct {
		name string
		p    hostEnvPolicy
		want []string
	}{
		{"default", hostEnvPolicy(defaultHostEnv), []string{
			"LANG=C.UTF-8", "MY_FLAG=1", "NOMAD_ALLOC_ID=a1", "OPENBLAS_NUM_THREADS=2", "PATH=/usr/bin:/bin"}},
		{"OPENBLAS_* too", hostEnvPolicy{"PATH", "OPENBLAS_*"}, []string{
			"MY_FLAG=1", "NOMAD_ALLOC_ID=a1", "OPENBLAS_CORETYPE=Haswell", "OPENBLAS_L2_SIZE=512", "OPENBLAS_NUM_THREADS=2", "PATH=/usr/bin:/bin"}},
		{"nothing", hostEnvPolicy{}, []string{"MY_FLAG=1", "NOMAD_ALLOC_ID=a1", "OPENBLAS_NUM_THREADS=2"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := taskEnvList(task, agent, c.p); !reflect.DeepEqual(got, c.want) {
				t.Errorf("task env\n  %q\nwant\n  %q", got, c.want)
			}
		})
	}
}

func TestAgentEnvironLeavesOutGoPluginsHandshake(t *testing.T) {
	got := agentEnviron([]string{"PATH=/bin", "NOMAD_PLUGIN_MAGIC_COOKIE=x", "PLUGIN_MIN_PORT=10000",
		"PLUGIN_MAX_PORT=25000", "PLUGIN_PROTOCOL_VERSIONS=2", "A=b=c"})
	want := map[string]string{"PATH": "/bin", "A": "b=c"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("agent environment %v, want %v", got, want)
	}
	if got := allowedAgentEnv(got, hostEnvPolicy{"*"}); !reflect.DeepEqual(got, want) {
		t.Errorf(`host_env ["*"] passes %v, want %v`, got, want)
	}
}

// A container member's ranks get the agent's allowed variables where the
// container (its image, Nomad's docker task env) does not set them: the
// same OPENBLAS_CORETYPE as a host member, but the image's own PATH.
func TestContainerRanksGetTheAllowedAgentEnvUnderTheirOwn(t *testing.T) {
	agent := map[string]string{"PATH": "/usr/sbin:/usr/bin", "OPENBLAS_CORETYPE": "Haswell", "HOME": "/root"}
	s := &supervisor.Spec{NProcPerNode: 1, HostEnv: allowedAgentEnv(agent, hostEnvPolicy{"PATH", "OPENBLAS_*"})}
	env := environMap(supervisor.WorkerEnv([]string{"PATH=/opt/conda/bin:/usr/bin", "NOMAD_ALLOC_ID=a1"}, s,
		supervisor.Placement{Round: 1, NNodes: 1, WorldSize: 1, MasterAddr: "127.0.0.1:1234"}, 0))
	if env["OPENBLAS_CORETYPE"] != "Haswell" || env["PATH"] != "/opt/conda/bin:/usr/bin" || env["NOMAD_ALLOC_ID"] != "a1" {
		t.Errorf("container rank env: OPENBLAS_CORETYPE=%q PATH=%q NOMAD_ALLOC_ID=%q", env["OPENBLAS_CORETYPE"], env["PATH"], env["NOMAD_ALLOC_ID"])
	}
	if _, ok := env["HOME"]; ok && env["HOME"] == "/root" {
		t.Errorf("the agent's HOME reached a container rank")
	}
}
