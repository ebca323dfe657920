package render_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/spec"
)

func mustParse(t *testing.T, src string) *spec.Train {
	t.Helper()
	tr, files, diags := spec.LoadSource([]byte(src), "t.hcl", spec.Options{})
	if diags.HasErrors() {
		t.Fatal(spec.Format(diags, files))
	}
	return tr
}

func TestJobspecShapes(t *testing.T) {
	for _, c := range []struct {
		name      string
		src       string
		want, not []string
	}{
		{
			name: "defaults",
			src:  `train "x" { command = "/bin/true" }`,
			want: []string{
				`job "x" {`, `type        = "batch"`, `datacenters = ["*"]`, `count = 1`,
				`port "rdzv" {`, `driver       = "gpujob"`, `kill_timeout = "30s"`, `command      = "/bin/true"`, `max_restarts = 3`,
				`nnodes       = "1"`, `join_timeout = "5m"`, `cpu    = 1000`, `memory = 2048`,
				`device "nvidia/gpu" {`, `count = 1`, `gpujob_workers         = "1"`,
			},
			not: []string{"priority", "namespace", "node_pool", "args", "env", "workdir", "artifact", "constraint"},
		},
		{
			name: "cpu-only has no device block",
			src:  "train \"x\" {\n  command = \"/bin/true\"\n  gpus_per_worker = 0\n}",
			want: []string{`gpujob_gpus_per_worker = "0"`},
			not:  []string{"device", "nvidia/gpu"},
		},
		{
			name: "shm adds to memory",
			src: `train "x" {
  command = "/bin/true"
  resources {
    memory = 4096
    shm    = 1024
  }
}`,
			want: []string{`memory = 5120`},
		},
		{
			name: "gpu constraints",
			src: `train "x" {
  command = "/bin/true"
  gpu {
    model      = "NVIDIA A100-SXM4-80GB"
    min_memory = "40000 MiB"
  }
}`,
			want: []string{`attribute = "${device.model}"`, `value     = "NVIDIA A100-SXM4-80GB"`,
				`attribute = "${device.attr.memory}"`, `operator  = ">="`, `value     = "40000 MiB"`},
		},
		{
			name: "interpolation in user strings is kept literal",
			src: `train "x" {
  command = "/bin/sh"
  args    = ["-c", "echo $${NOMAD_ALLOC_INDEX}"]
}`,
			want: []string{`args         = ["-c", "echo $${NOMAD_ALLOC_INDEX}"]`},
		},
		{
			name: "preload",
			src: `train "x" {
  command = "/usr/bin/python3"
  args    = ["-u", "train.py"]
  preload = ["torch", "torch.distributed"]
}`,
			want: []string{`preload      = ["torch", "torch.distributed"]`},
		},
		{
			name: "priority and checkpoint",
			src: `train "x" {
  command  = "/bin/true"
  priority = 80
  checkpoint {
    every = 7
  }
}`,
			want: []string{`priority    = 80`, `GPUJOB_CHECKPOINT_EVERY = "7"`},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, err := render.Jobspec(mustParse(t, c.src))
			if err != nil {
				t.Fatal(err)
			}
			checkJobspecText(t, string(out), c.want, c.not)
		})
	}
}

func TestJobspecRefusesIncomplete(t *testing.T) {
	if _, err := render.Jobspec(nil); err == nil {
		t.Error("nil spec rendered")
	}
	if _, err := render.Jobspec(&spec.Train{Name: "x", Workers: 1}); err == nil {
		t.Error("spec without command rendered")
	}
	for _, name := range []string{"../../tmp/escaped", "a/b", "with space"} {
		_, err := render.Jobspec(&spec.Train{Name: name, Command: "/bin/true", Workers: 1})
		if err == nil || !strings.Contains(err.Error(), "job name") {
			t.Errorf("job name %q: error %v, want one naming the job name", name, err)
		}
	}
}

func TestDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		5 * time.Minute:             "5m",
		90 * time.Second:            "1m30s",
		time.Hour:                   "1h",
		time.Hour + 30*time.Minute:  "1h30m",
		2*time.Hour + 5*time.Second: "2h0m5s",
		1500 * time.Millisecond:     "1.5s",
		10 * time.Minute:            "10m",
	} {
		if got := render.Duration(d); got != want {
			t.Errorf("Duration(%v) = %q, want %q", d, got, want)
		}
		if back, err := time.ParseDuration(render.Duration(d)); err != nil || back != d {
			t.Errorf("Duration(%v) = %q does not parse back: %v %v", d, render.Duration(d), back, err)
		}
	}
}

func TestMemory(t *testing.T) {
	for mib, want := range map[int]string{16384: "16 GiB", 1536: "1536 MiB", 1024: "1 GiB"} {
		if got := render.Memory(mib); got != want {
			t.Errorf("Memory(%d) = %q, want %q", mib, got, want)
		}
	}
}

// checkJobspecText checks that a rendered jobspec holds every want and,
// below its header comment, no not.
func checkJobspecText(t *testing.T, s string, want, not []string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(s, w) {
			t.Errorf("missing %q in\n%s", w, s)
		}
	}
	body := s[strings.Index(s, "job "):]
	for _, n := range not {
		if strings.Contains(body, n) {
			t.Errorf("unexpected %q in\n%s", n, s)
		}
	}
}
