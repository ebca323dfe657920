package driver

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/nomad/structs"
	"github.com/hashicorp/nomad/plugins/drivers"
)

func taskCfg() *drivers.TaskConfig {
	return &drivers.TaskConfig{
		ID: "a1/train/x", JobName: "bert", JobID: "bert", TaskGroupName: "train", Name: "train",
		Namespace: "ml", AllocID: "a1", AllocDir: "/var/nomad/alloc/a1",
		Env:       map[string]string{"NOMAD_ALLOC_NAME": "bert.train[2]", "NOMAD_ALLOC_INDEX": "2"},
		DeviceEnv: map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b,GPU-c"},
		Resources: &drivers.Resources{Ports: &structs.AllocatedPorts{
			{Label: "rdzv", Value: 24001, HostIP: "10.1.2.3"},
		}},
	}
}

func pluginCfg(t *testing.T) *Config {
	c := &Config{CheckpointRoot: "/shared/ckpt"}
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	return c
}

func noEnv(string) string { return "" }

func TestBuildSpec(t *testing.T) {
	tc := &TaskConfig{Command: "/usr/bin/python3", Args: []string{"train.py"}, MaxRestarts: 2,
		Rendezvous: &RendezvousConfig{NNodes: "2:4", JoinTimeout: "90s", Port: "rdzv"}}
	s, err := buildSpec(taskCfg(), tc, pluginCfg(t), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"nproc defaults to the reserved GPUs", s.NProcPerNode, 3},
		{"log prefix on with several processes", s.LogPrefix, true},
		{"min", s.Min, 2},
		{"max", s.Max, 4},
		{"join timeout", time.Duration(s.JoinTimeout), 90 * time.Second},
		{"last call default", time.Duration(s.LastCall), defaultLastCall},
		{"run id is namespace/job without a submission stamp", s.RunID, "ml/bert"},
		{"no run group without a submission stamp", s.RunGroup, ""},
		{"member name", s.Self.Name, "bert.train[2]"},
		{"member address is the labelled port on its host IP", s.Self.Addr, "10.1.2.3:24001"},
		{"expected members", strings.Join(s.Expected, ","), "bert.train[0],bert.train[1],bert.train[2],bert.train[3]"},
		{"checkpoint dir", s.CheckpointDir, "/shared/ckpt/ml/bert"},
		{"consul default", s.Consul.Address, "127.0.0.1:8500"},
		{"key prefix default", s.Consul.KeyPrefix, "gpujob/rendezvous"},
		{"session ttl default", time.Duration(s.Consul.SessionTTL), 10 * time.Second},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestBuildSpecErrorsNameTheField(t *testing.T) {
	cases := []struct {
		name string
		tc   TaskConfig
		want string
	}{
		{"no command", TaskConfig{}, "command"},
		{"bad nnodes", TaskConfig{Command: "x", Rendezvous: &RendezvousConfig{NNodes: "four"}}, "rendezvous.nnodes"},
		{"min above max", TaskConfig{Command: "x", Rendezvous: &RendezvousConfig{NNodes: "4:2"}}, "rendezvous.nnodes"},
		{"bad timeout", TaskConfig{Command: "x", Rendezvous: &RendezvousConfig{JoinTimeout: "soon"}}, "rendezvous.join_timeout"},
		{"bad last call", TaskConfig{Command: "x", Rendezvous: &RendezvousConfig{LastCall: "-1s"}}, "rendezvous.last_call"},
		{"negative restarts", TaskConfig{Command: "x", MaxRestarts: -1}, "max_restarts"},
		{"negative nproc", TaskConfig{Command: "x", NProcPerNode: -2}, "nproc_per_node"},
		{"relative workdir", TaskConfig{Command: "x", Workdir: "code"}, "workdir"},
		{"preload with a command that is not Python", TaskConfig{Command: "/bin/bash", Args: []string{"t.sh"}, Preload: []string{"torch"}}, "preload"},
		{"preload of a bad module", TaskConfig{Command: "/usr/bin/python3", Args: []string{"t.py"}, Preload: []string{"a b"}}, "preload[0]"},
		{"multi-node without a port", TaskConfig{Command: "x", Rendezvous: &RendezvousConfig{NNodes: "2"}}, "rendezvous.port: required"},
		{"unknown port label", TaskConfig{Command: "x", Rendezvous: &RendezvousConfig{NNodes: "2", Port: "nope"}}, `no port labelled "nope"`},
		// A host member's kill_timeout comes with the stop (StopTask).
		{"container kill timeout on a host member", TaskConfig{Command: "x", ContainerKillTimeout: "30s"}, "container_kill_timeout: only a container member's sidecar"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := buildSpec(taskCfg(), &c.tc, pluginCfg(t), noEnv)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one naming %q", err, c.want)
			}
		})
	}
}

func TestRunPerSubmission(t *testing.T) {
	cfg := taskCfg()
	cfg.Env["NOMAD_META_gpujob_run"] = "1764490000"
	s, err := buildSpec(cfg, &TaskConfig{Command: "x", Rendezvous: &RendezvousConfig{NNodes: "2", Port: "rdzv"}}, pluginCfg(t), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if s.RunID != "ml/bert/1764490000" || s.RunGroup != "ml/bert" {
		t.Errorf("run %q in group %q, want ml/bert/1764490000 in ml/bert", s.RunID, s.RunGroup)
	}
	cfg.Env["NOMAD_META_gpujob_run"] = "a/b"
	s, _ = buildSpec(cfg, &TaskConfig{Command: "x", Rendezvous: &RendezvousConfig{NNodes: "2", Port: "rdzv"}}, pluginCfg(t), noEnv)
	if s.RunID != "ml/bert" {
		t.Errorf("a run stamp with a path in it was used: %q", s.RunID)
	}
}

func TestCheckpointDirPerSubmission(t *testing.T) {
	cfg := taskCfg()
	cfg.Env["NOMAD_META_gpujob_run"] = "1764490000"
	s, err := buildSpec(cfg, &TaskConfig{Command: "x", Rendezvous: &RendezvousConfig{NNodes: "2", Port: "rdzv"}}, pluginCfg(t), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if s.CheckpointDir != "/shared/ckpt/ml/bert/1764490000" {
		t.Errorf("checkpoint dir %q, want one per submission", s.CheckpointDir)
	}
	cfg.Env["NOMAD_META_gpujob_run"] = "../../etc"
	s, _ = buildSpec(cfg, &TaskConfig{Command: "x", Rendezvous: &RendezvousConfig{NNodes: "2", Port: "rdzv"}}, pluginCfg(t), noEnv)
	if s.CheckpointDir != "/shared/ckpt/ml/bert" {
		t.Errorf("a run stamp with a path in it was used: %q", s.CheckpointDir)
	}
}

func TestBuildSpecSingleNodeNeedsNoPort(t *testing.T) {
	cfg := taskCfg()
	cfg.DeviceEnv = nil
	no := false
	s, err := buildSpec(cfg, &TaskConfig{Command: "x", LogPrefix: &no}, pluginCfg(t), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if s.NProcPerNode != 1 || s.Min != 1 || s.Max != 1 || !strings.HasPrefix(s.Self.Addr, "127.0.0.1:") || s.LogPrefix {
		t.Fatalf("single node CPU task: %+v", s)
	}
}

func TestConsulFromEnvironment(t *testing.T) {
	env := map[string]string{"CONSUL_HTTP_ADDR": "https://consul.internal:8501", "CONSUL_HTTP_TOKEN": "tok", "CONSUL_CACERT": "/ca.pem"}
	c, err := consulSpec(pluginCfg(t), func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if c.Address != "consul.internal:8501" || c.Scheme != "https" || c.Token != "tok" || c.CAFile != "/ca.pem" {
		t.Fatalf("consul spec %+v", c)
	}
	// The plugin config wins over the environment.
	pc := pluginCfg(t)
	pc.Consul.Address, pc.Consul.Token = "10.0.0.1:8500", "cfg"
	c, _ = consulSpec(pc, func(k string) string { return env[k] })
	if c.Address != "10.0.0.1:8500" || c.Token != "cfg" {
		t.Fatalf("plugin config did not win: %+v", c)
	}
}

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		want string
	}{
		{"defaults", Config{}, ""},
		{"bad ttl", Config{SessionTTL: "ten"}, "session_ttl"},
		{"ttl below consul's minimum", Config{SessionTTL: "2s"}, "session_ttl"},
		{"relative checkpoint root", Config{CheckpointRoot: "ckpt"}, "checkpoint_root"},
		{"prefix with slash", Config{KeyPrefix: "/gpujob"}, "key_prefix"},
		{"cert without key", Config{Consul: &ConsulConfig{CertFile: "/c.pem"}}, "consul: cert_file and key_file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.cfg.validate()
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one naming %q", err, c.want)
			}
		})
	}
}

// Nomad accepts almost any job ID in a job written by hand; none may lead
// the checkpoint directory out of checkpoint_root or put a raw '/', '.' or
// '..' segment into the rendezvous keys (issue 8).
func TestHandWrittenNamesStayUnderTheCheckpointRoot(t *testing.T) {
	long := strings.Repeat("x", 300)
	cases := []struct {
		jobID, run string
		wantJob    string // the job's segment in paths, keys and member names
	}{
		{"../../x", "", "~2E.~2F..~2Fx"},
		{"../../../../../tmp/escaped", "1764490000", ""},
		{"a/b", "", "a~2Fb"},
		{"a%2Fb", "", "a~252Fb"},
		{"..", "", "~2E."},
		{".", "1764490000", "~2E"},
		{"with space", "", "with~20space"},
		{"tab\tnewline\n", "", "tab~09newline~0A"},
		{"q?x#y", "", "q~3Fx~23y"},
		{long, "", ""},
		{"données/日本", "", "donn~C3~A9es~2F~E6~97~A5~E6~9C~AC"},
		{"bert", "../../etc", "bert"},
		{"bert", "ctl", "bert"},
	}
	for _, c := range cases {
		t.Run(c.jobID, func(t *testing.T) {
			cfg := taskCfg()
			cfg.JobID, cfg.JobName = c.jobID, c.jobID
			delete(cfg.Env, "NOMAD_ALLOC_NAME") // Nomad's would hold the raw ID
			if c.run != "" {
				cfg.Env["NOMAD_META_gpujob_run"] = c.run
			}
			pc := pluginCfg(t)
			s, err := buildSpec(cfg, &TaskConfig{Command: "x", Rendezvous: &RendezvousConfig{NNodes: "2", Port: "rdzv"}}, pc, noEnv)
			if err != nil {
				t.Fatal(err)
			}
			rel, err := filepath.Rel(pc.CheckpointRoot, s.CheckpointDir)
			if err != nil || strings.HasPrefix(rel, "..") || filepath.IsAbs(rel) {
				t.Fatalf("checkpoint dir %q is not under %q", s.CheckpointDir, pc.CheckpointRoot)
			}
			segs := strings.Split(rel, string(filepath.Separator))
			if segs[0] != "ml" || filepath.Join(pc.CheckpointRoot, rel) != s.CheckpointDir {
				t.Fatalf("checkpoint dir %q: want <root>/ml/<job>[/<run>]", s.CheckpointDir)
			}
			keys := strings.Split(s.RunID, "/")
			if s.RunGroup != "" && s.RunID != s.RunGroup+"/"+keys[len(keys)-1] {
				t.Fatalf("run %q is not its group %q plus one segment", s.RunID, s.RunGroup)
			}
			wantLevels := 2
			if c.run == "1764490000" {
				wantLevels = 3
			}
			if len(segs) != wantLevels || len(keys) != wantLevels {
				t.Fatalf("checkpoint dir %q and run %q: want %d levels each (a run stamp that is no plain name is ignored)",
					s.CheckpointDir, s.RunID, wantLevels)
			}
			for i, seg := range keys {
				if seg != segs[i] {
					t.Errorf("key segment %q differs from directory %q", seg, segs[i])
				}
				if seg == "" || seg == "." || seg == ".." || len(seg) > 128 || strings.ContainsAny(seg, "/\\%?# \t\n\x00") {
					t.Errorf("run %q has the unsafe segment %q", s.RunID, seg)
				}
			}
			if c.wantJob != "" && keys[1] != c.wantJob {
				t.Errorf("job segment %q, want %q", keys[1], c.wantJob)
			}
			// Member names carry the same segment; the rendezvous refuses
			// tabs and newlines in them.
			if want := keys[1] + ".train[2]"; s.Self.Name != want || s.Expected[0] != keys[1]+".train[0]" {
				t.Errorf("member %q expecting %v, want %q", s.Self.Name, s.Expected, want)
			}
		})
	}
}

func TestLongJobIDsDoNotCollide(t *testing.T) {
	a, b := strings.Repeat("x", 300), strings.Repeat("x", 299)+"y"
	dirs := map[string]bool{}
	for _, id := range []string{a, b} {
		cfg := taskCfg()
		cfg.JobID = id
		s, err := buildSpec(cfg, &TaskConfig{Command: "x"}, pluginCfg(t), noEnv)
		if err != nil {
			t.Fatal(err)
		}
		if len(filepath.Base(s.CheckpointDir)) > 128 {
			t.Errorf("directory name of %d bytes", len(filepath.Base(s.CheckpointDir)))
		}
		dirs[s.CheckpointDir] = true
	}
	if len(dirs) != 2 {
		t.Fatalf("two 300-byte job IDs share a checkpoint dir: %v", dirs)
	}
}

func TestCheckpointDirRefusesToLeaveTheRoot(t *testing.T) {
	ok := []struct {
		parts []string
		want  string
	}{
		{[]string{"ml", "bert"}, "/shared/ckpt/ml/bert"},
		{[]string{"ml", "bert", "1764490000"}, "/shared/ckpt/ml/bert/1764490000"},
		{[]string{"ml", "bert", ""}, "/shared/ckpt/ml/bert"},
	}
	for _, c := range ok {
		got, err := checkpointDir("/shared/ckpt", c.parts...)
		if err != nil || got != c.want {
			t.Errorf("checkpointDir(%q) = %q, %v; want %q", c.parts, got, err, c.want)
		}
	}
	// Parts that are not safename segments: the Rel check catches them.
	for _, parts := range [][]string{
		{"..", ".."},
		{"ml", "../../../tmp/escaped"},
		{"ml", ".."},
		{"ml", "a/b"},
		{"ml", "."},
		{"", ""},
	} {
		if got, err := checkpointDir("/shared/ckpt", parts...); err == nil || !strings.Contains(err.Error(), "checkpoint_root") {
			t.Errorf("checkpointDir(%q) = %q, %v; want an error naming checkpoint_root", parts, got, err)
		}
	}
}

func TestTaskNameMustBeItsOwnDirectory(t *testing.T) {
	for _, name := range []string{"", ".", "..", "alloc", "a/b"} {
		cfg := taskCfg()
		cfg.Name = name
		if _, err := buildSpec(cfg, &TaskConfig{Command: "x"}, pluginCfg(t), noEnv); err == nil || !strings.Contains(err.Error(), "task name") {
			t.Errorf("task %q: error %v, want one naming the task name", name, err)
		}
	}
}

func TestBuildSpecServiceReplica(t *testing.T) {
	pc := pluginCfg(t)
	pc.Consul = &ConsulConfig{Address: "10.0.0.1:8500", Token: "secret-token"}
	tc := &TaskConfig{Command: "/usr/bin/python3", Args: []string{"serve.py"}, MaxRestarts: 3, Service: true}
	s, err := buildSpec(taskCfg(), tc, pc, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Solo || s.Min != 1 || s.Max != 1 {
		t.Errorf("solo %v, nnodes %d:%d; want a solo group of one", s.Solo, s.Min, s.Max)
	}
	if s.NProcPerNode != 1 {
		t.Errorf("nproc %d with 3 GPUs; a replica is one process", s.NProcPerNode)
	}
	if s.MaxRestarts != 0 {
		t.Errorf("max restarts %d; a replica restarts through Nomad", s.MaxRestarts)
	}
	if s.Consul.Address != "" || s.Consul.Token != "" {
		t.Errorf("a replica's supervisor got Consul %+v; it needs none", s.Consul)
	}

	for _, c := range []struct {
		name string
		tc   TaskConfig
		want string
	}{
		{"rendezvous", TaskConfig{Command: "x", Service: true, Rendezvous: &RendezvousConfig{}}, "rendezvous"},
		{"trial", TaskConfig{Command: "x", Service: true, Sweep: "s", Trial: "t"}, "trial"},
		{"nproc", TaskConfig{Command: "x", Service: true, NProcPerNode: 2}, "one process"},
		{"container", TaskConfig{Command: "x", Service: true, ContainerTask: "c"}, "container"},
	} {
		if _, err := buildSpec(taskCfg(), &c.tc, pc, noEnv); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error about %q", c.name, err, c.want)
		}
	}
}
