package supervisor

import (
	"strings"
	"testing"
)

func envMap(env []string) map[string]string {
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

func TestWorkerEnv(t *testing.T) {
	spec := &Spec{NProcPerNode: 2, RunID: "default/bert", RoleName: "default", MaxRestarts: 3,
		CheckpointDir: "/ckpt/default/bert", Env: map[string]string{"EXTRA": "1", "NCCL_DEBUG": "WARN"}}
	p := Placement{Round: 3, Restarts: 2, NodeRank: 1, NNodes: 3, RankOffset: 4, WorldSize: 8, MasterAddr: "10.0.0.5:29400"}
	base := []string{"PATH=/usr/bin", "CUDA_VISIBLE_DEVICES=GPU-a,GPU-b", "CONSUL_HTTP_TOKEN=secret", "NOMAD_TOKEN=x", "NCCL_DEBUG=INFO"}

	env := envMap(WorkerEnv(base, spec, p, 1))
	want := map[string]string{
		"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "2",
		"GROUP_RANK": "1", "GROUP_WORLD_SIZE": "3", "ROLE_RANK": "5", "ROLE_WORLD_SIZE": "8", "ROLE_NAME": "default",
		"MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29400",
		"TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_MAX_RESTARTS": "3", "TORCHELASTIC_RUN_ID": "default/bert",
		"GPUJOB_RANK": "5", "GPUJOB_LOCAL_RANK": "1", "GPUJOB_NODE_RANK": "1", "GPUJOB_NNODES": "3",
		"GPUJOB_GENERATION": "3", "GPUJOB_RESTART_COUNT": "2", "GPUJOB_CHECKPOINT_DIR": "/ckpt/default/bert",
		"GPUJOB_MASTER_ADDR": "10.0.0.5", "GPUJOB_MASTER_PORT": "29400",
		"OMP_NUM_THREADS":      "1",
		"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b", // from the device reservation, untouched
		"PATH":                 "/usr/bin", "EXTRA": "1",
		"NCCL_DEBUG": "WARN", // the task config's env wins over the task's environment
	}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("%s = %q, want %q", k, env[k], v)
		}
	}
	for _, secret := range []string{"CONSUL_HTTP_TOKEN", "NOMAD_TOKEN"} {
		if _, ok := env[secret]; ok {
			t.Errorf("%s leaked into a worker's environment", secret)
		}
	}
}

func TestWorkerEnvOMPThreads(t *testing.T) {
	p := Placement{Round: 1, NNodes: 1, WorldSize: 1, MasterAddr: "127.0.0.1:1"}
	cases := []struct {
		name  string
		nproc int
		base  []string
		want  string
	}{
		{"one process keeps the default", 1, nil, ""},
		{"several processes get 1", 4, nil, "1"},
		{"the user's value is kept", 4, []string{"OMP_NUM_THREADS=8"}, "8"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env := envMap(WorkerEnv(c.base, &Spec{NProcPerNode: c.nproc}, p, 0))
			if env["OMP_NUM_THREADS"] != c.want {
				t.Errorf("OMP_NUM_THREADS = %q, want %q", env["OMP_NUM_THREADS"], c.want)
			}
		})
	}
}

func TestRanksArePrefixSums(t *testing.T) {
	// Three members with 2, 1 and 4 local processes: every global rank
	// 0..6 is held by exactly one process.
	sizes := []int{2, 1, 4}
	seen := map[string]bool{}
	offset := 0
	for node, n := range sizes {
		p := Placement{NodeRank: node, NNodes: 3, RankOffset: offset, WorldSize: 7, MasterAddr: "h:1"}
		for local := 0; local < n; local++ {
			r := envMap(WorkerEnv(nil, &Spec{NProcPerNode: n}, p, local))["RANK"]
			if seen[r] {
				t.Fatalf("rank %s given twice", r)
			}
			seen[r] = true
		}
		offset += n
	}
	if len(seen) != 7 {
		t.Fatalf("%d ranks, want 7", len(seen))
	}
}
