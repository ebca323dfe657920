package spec_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/gpujob/gpujob/cli/spec"
)

const minimal = `train "job" {
  command = "/usr/bin/python3"
}
`

func parse(t *testing.T, src string, o spec.Options) (*spec.Train, string) {
	t.Helper()
	tr, files, diags := spec.LoadSource([]byte(src), "spec.hcl", o)
	if diags.HasErrors() {
		if tr != nil {
			t.Errorf("a spec with errors returned a Train")
		}
		return nil, spec.Format(diags, files)
	}
	return tr, ""
}

func TestDefaults(t *testing.T) {
	tr, errs := parse(t, minimal, spec.Options{})
	if errs != "" {
		t.Fatal(errs)
	}
	want := &spec.Train{
		Name:              "job",
		Workers:           1,
		GPUsPerWorker:     1,
		Command:           "/usr/bin/python3",
		Resources:         spec.Resources{CPU: 1000, MemoryMiB: 2048},
		MaxFailures:       3,
		RendezvousTimeout: 5 * time.Minute,
		CheckpointGrace:   spec.DefaultCheckpointGrace,
		Datacenters:       []string{"*"},
		Priority:          50,
	}
	tr.Ranges = spec.Ranges{}
	if !reflect.DeepEqual(tr, want) {
		t.Errorf("defaults:\n got %+v\nwant %+v", tr, want)
	}
}

func TestFullSpec(t *testing.T) {
	src := `
variable "n" {
  type    = number
  default = 3
}
train "full" {
  workers            = var.n
  gpus_per_worker    = 2
  command            = "/usr/bin/python3"
  args               = ["train.py", "--epochs", 3]
  env                = { NCCL_DEBUG = "WARN", "A_B" = 1 }
  workdir            = "/shared/full"
  artifact {
    source      = "https://example.com/code.tar.gz"
    destination = "local/code"
    options     = { checksum = "sha256:abc" }
  }
  artifact {
    source = "https://example.com/data.tar.gz"
  }
  resources {
    cpu    = 2000
    memory = 4096
    shm    = 1024
  }
  gpu {
    model      = "Tesla T4"
    min_memory = "16 GiB"
  }
  checkpoint {
    every = 20
  }
  max_failures       = 0
  rendezvous_timeout = "90s"
  datacenters        = ["dc1"]
  node_pool          = "gpu"
  namespace          = "ml"
  priority           = 100
  meta               = { team = "nlp" }
}`
	tr, errs := parse(t, src, spec.Options{})
	if errs != "" {
		t.Fatal(errs)
	}
	want := &spec.Train{
		Name: "full", Workers: 3, GPUsPerWorker: 2, Command: "/usr/bin/python3",
		Args:    []string{"train.py", "--epochs", "3"},
		Env:     map[string]string{"NCCL_DEBUG": "WARN", "A_B": "1"},
		Workdir: "/shared/full",
		Artifacts: []spec.Artifact{
			{Source: "https://example.com/code.tar.gz", Destination: "local/code", Options: map[string]string{"checksum": "sha256:abc"}},
			{Source: "https://example.com/data.tar.gz"},
		},
		Resources:         spec.Resources{CPU: 2000, MemoryMiB: 4096, ShmMiB: 1024},
		GPU:               &spec.GPU{Model: "Tesla T4", MinMemoryMiB: 16384},
		CheckpointEvery:   20,
		MaxFailures:       0,
		RendezvousTimeout: 90 * time.Second,
		CheckpointGrace:   spec.DefaultCheckpointGrace,
		Datacenters:       []string{"dc1"},
		NodePool:          "gpu",
		Namespace:         "ml",
		Priority:          100,
		Meta:              map[string]string{"team": "nlp"},
	}
	ranges := tr.Ranges
	tr.Ranges = spec.Ranges{}
	if !reflect.DeepEqual(tr, want) {
		t.Errorf("full spec:\n got %+v\nwant %+v", tr, want)
	}
	for name, line := range map[string]int{"block": 6, "workers": 7, "gpus": 8, "resources.shm": 24, "gpu.model": 27} {
		var r hcl.Range
		switch name {
		case "block":
			r = ranges.Block
		case "workers":
			r = ranges.Workers
		case "gpus":
			r = ranges.GPUsPerWorker
		default:
			r = ranges.Of(name)
		}
		if r.Filename != "spec.hcl" || r.Start.Line != line {
			t.Errorf("range of %s = %s, want line %d", name, r, line)
		}
	}
	if tr.Resources.TaskMemoryMiB() != 5120 {
		t.Errorf("TaskMemoryMiB = %d", tr.Resources.TaskMemoryMiB())
	}
}

func TestImageSpec(t *testing.T) {
	src := `variable "image" {
  default = "gpujob-train:latest"
}
train "img" {
  command = "/usr/bin/python3"
  image   = var.image
  image_pull {
    force   = true
    timeout = "10m"
    auth {
      username       = "robot"
      password       = "s3cret"
      server_address = "registry.example.com"
    }
  }
  resources {
    memory = 4096
    shm    = 1024
  }
}`
	tr, errs := parse(t, src, spec.Options{Vars: []string{"image=registry.example.com/ml/bert:1.4"}})
	if errs != "" {
		t.Fatal(errs)
	}
	if tr.Image != "registry.example.com/ml/bert:1.4" {
		t.Errorf("image %q", tr.Image)
	}
	want := &spec.ImagePull{Force: true, Timeout: 10 * time.Minute,
		Auth: &spec.RegistryAuth{Username: "robot", Password: "s3cret", ServerAddress: "registry.example.com"}}
	if !reflect.DeepEqual(tr.ImagePull, want) {
		t.Errorf("image_pull %+v, want %+v", tr.ImagePull, want)
	}
	for path, line := range map[string]int{"image": 6, "image_pull": 7, "image_pull.timeout": 9, "image_pull.auth": 10, "image_pull.auth.password": 12} {
		if r := tr.Ranges.Of(path); r.Start.Line != line {
			t.Errorf("range of %s = %s, want line %d", path, r, line)
		}
	}
	// A container's /dev/shm is docker's shm_size: the member task reserves
	// memory alone, the allocation the sidecar's too.
	if tr.MemberMemoryMiB() != 4096 || tr.WorkerMemoryMiB() != 4096+spec.SidecarMemoryMiB || tr.WorkerCPU() != 1000+spec.SidecarCPU {
		t.Errorf("member memory %d, worker %d MiB %d MHz", tr.MemberMemoryMiB(), tr.WorkerMemoryMiB(), tr.WorkerCPU())
	}
	tr.Image = ""
	if tr.MemberMemoryMiB() != 5120 || tr.WorkerMemoryMiB() != 5120 || tr.WorkerCPU() != 1000 {
		t.Errorf("host: member memory %d, worker %d MiB %d MHz", tr.MemberMemoryMiB(), tr.WorkerMemoryMiB(), tr.WorkerCPU())
	}

	// image alone; image_pull with nothing in it.
	tr, errs = parse(t, "train \"x\" {\n  command = \"a\"\n  image = \"busybox\"\n  image_pull {\n  }\n}\n", spec.Options{})
	if errs != "" {
		t.Fatal(errs)
	}
	if tr.Image != "busybox" || !reflect.DeepEqual(tr.ImagePull, &spec.ImagePull{}) {
		t.Errorf("image %q, image_pull %+v", tr.Image, tr.ImagePull)
	}
}

// TestErrors: every error names file:line:col and says what is wrong.
func TestErrors(t *testing.T) {
	// train wraps attribute lines in a train block that starts on line 1,
	// so the first body line is line 2.
	train := func(lines ...string) string {
		return "train \"job\" {\n" + strings.Join(lines, "\n") + "\n}\n"
	}
	cmd := `  command = "/bin/true"`
	for _, c := range []struct {
		name string
		src  string
		o    spec.Options
		want []string // substrings of the formatted diagnostics, the first being the position
	}{
		{"unknown field", train(cmd, "  worker = 2"), spec.Options{},
			[]string{"spec.hcl:3:3: error: Unsupported argument", `"worker"`, `Did you mean "workers"?`}},
		{"unknown block", train(cmd, "  resource {", "  }"), spec.Options{},
			[]string{"spec.hcl:3:3: error: Unsupported block type", `"resource"`}},
		{"unknown top-level", "job \"x\" {\n}\n" + minimal, spec.Options{},
			[]string{"spec.hcl:1:1: error: Unsupported block type", `"job"`}},
		{"wrong type number", train(cmd, `  workers = "two"`), spec.Options{},
			[]string{"spec.hcl:3:13: error: Incorrect attribute value type", "a number is required"}},
		{"wrong type list", train(cmd, `  args = "train.py"`), spec.Options{},
			[]string{"spec.hcl:3:10: error: Incorrect attribute value type", `"args"`, "list of string required"}},
		{"wrong type map", train(cmd, `  env = ["A=1"]`), spec.Options{},
			[]string{"spec.hcl:3:9: error: Incorrect attribute value type", `"env"`}},
		{"fractional", train(cmd, `  workers = 1.5`), spec.Options{},
			[]string{"spec.hcl:3:13: error: Incorrect attribute value type", "whole number"}},
		{"workers = 0", train(cmd, "  workers = 0"), spec.Options{},
			[]string{"spec.hcl:3:13: error: Invalid workers", "at least 1, got 0"}},
		{"negative gpus", train(cmd, "  gpus_per_worker = -1"), spec.Options{},
			[]string{"spec.hcl:3:21: error: Invalid gpus_per_worker", "got -1"}},
		{"priority = 500", train(cmd, "  priority = 500"), spec.Options{},
			[]string{"spec.hcl:3:14: error: Invalid priority", "between 1 and 100, got 500"}},
		{"priority = 0", train(cmd, "  priority = 0"), spec.Options{},
			[]string{"spec.hcl:3:14: error: Invalid priority"}},
		{"negative cpu", train(cmd, "  resources {", "    cpu = -5", "  }"), spec.Options{},
			[]string{"spec.hcl:4:11: error: Invalid resources.cpu", "got -5"}},
		{"negative memory", train(cmd, "  resources {", "    memory = -1", "  }"), spec.Options{},
			[]string{"spec.hcl:4:14: error: Invalid resources.memory", "at least 10"}},
		{"preload of a bad module name", train(`  command = "/usr/bin/python3"`, `  args = ["t.py"]`, `  preload = ["torch", "os;x"]`), spec.Options{},
			[]string{"spec.hcl:4:13: error: Invalid preload", `"os;x" is not a Python module name`}},
		{"preload with a command that is not Python", train(`  command = "/usr/bin/torchrun"`, `  args = ["t.py"]`, `  preload = ["torch"]`), spec.Options{},
			[]string{"spec.hcl:4:13: error: Invalid preload", "needs a Python interpreter", "/usr/bin/torchrun"}},
		{"preload with an interpreter option it cannot reproduce", train(`  command = "/usr/bin/python3"`, `  args = ["-X", "dev", "t.py"]`, `  preload = ["torch"]`), spec.Options{},
			[]string{"spec.hcl:4:13: error: Invalid preload", `interpreter option "-X"`}},
		{"negative shm", train(cmd, "  resources {", "    shm = -1024", "  }"), spec.Options{},
			[]string{"spec.hcl:4:11: error: Invalid resources.shm", "at least 0"}},
		{"bad min_memory unit", train(cmd, "  gpu {", `    min_memory = "16 GB/s"`, "  }"), spec.Options{},
			[]string{"spec.hcl:4:18: error: Invalid gpu.min_memory", `unknown unit "GB/s"`, "MiB, GiB, MB or GB"}},
		{"min_memory without unit", train(cmd, "  gpu {", `    min_memory = "16"`, "  }"), spec.Options{},
			[]string{"spec.hcl:4:18: error: Invalid gpu.min_memory", "no unit"}},
		{"gpu block on CPU job", train(cmd, "  gpus_per_worker = 0", "  gpu {", `    model = "T4"`, "  }"), spec.Options{},
			[]string{"spec.hcl:4:3: error: GPU constraints on a CPU job"}},
		{"bad duration", train(cmd, `  rendezvous_timeout = "5 minutes"`), spec.Options{},
			[]string{"spec.hcl:3:24: error: Invalid duration", `"5 minutes"`}},
		{"negative duration", train(cmd, `  rendezvous_timeout = "-5m"`), spec.Options{},
			[]string{"spec.hcl:3:24: error: Invalid duration", "positive"}},
		{"missing command", train(`  workers = 2`), spec.Options{},
			[]string{"spec.hcl:1:1: error: Missing required argument", "command"}},
		{"empty command", train(`  command = ""`), spec.Options{},
			[]string{"spec.hcl:2:13: error: Invalid command"}},
		{"two train blocks", minimal + "\ntrain \"other\" {\n" + cmd + "\n}\n", spec.Options{},
			[]string{"spec.hcl:5:1: error: Duplicate train block", "spec.hcl:1,1-12"}},
		{"no train block", "variable \"x\" {\n  default = 1\n}\n", spec.Options{},
			[]string{"spec.hcl:1:1: error: Missing train block"}},
		{"duplicate resources", train(cmd, "  resources {", "  }", "  resources {", "  }"), spec.Options{},
			[]string{"spec.hcl:5:3: error: Duplicate resources block"}},
		{"relative workdir", train(cmd, `  workdir = "shared/x"`), spec.Options{},
			[]string{"spec.hcl:3:13: error: Invalid workdir", "absolute"}},
		{"bad env name", train(cmd, `  env = { "A-B" = "1" }`), spec.Options{},
			[]string{"spec.hcl:3:9: error: Invalid env", `"A-B"`}},
		{"reserved meta", train(cmd, `  meta = { gpujob = "x" }`), spec.Options{},
			[]string{"spec.hcl:3:10: error: Reserved meta key"}},
		{"bad namespace", train(cmd, `  namespace = "my ns"`), spec.Options{},
			[]string{"spec.hcl:3:15: error: Invalid namespace"}},
		{"empty datacenters", train(cmd, `  datacenters = []`), spec.Options{},
			[]string{"spec.hcl:3:17: error: Invalid datacenters"}},
		{"negative max_failures", train(cmd, `  max_failures = -1`), spec.Options{},
			[]string{"spec.hcl:3:18: error: Invalid max_failures"}},
		{"checkpoint every 0", train(cmd, "  checkpoint {", "    every = 0", "  }"), spec.Options{},
			[]string{"spec.hcl:4:13: error: Invalid checkpoint.every"}},
		{"checkpoint without every", train(cmd, "  checkpoint {", "  }"), spec.Options{},
			[]string{"spec.hcl:3:14: error: Missing required argument", `"every"`}},
		{"artifact without source", train(cmd, "  artifact {", `    destination = "local"`, "  }"), spec.Options{},
			[]string{"spec.hcl:3:12: error: Missing required argument", `"source"`}},
		// Images (issue 13).
		{"empty image", train(cmd, `  image = ""`), spec.Options{},
			[]string{"spec.hcl:3:11: error: Invalid image", "may not be empty"}},
		{"blank image", train(cmd, `  image = "  "`), spec.Options{},
			[]string{"spec.hcl:3:11: error: Invalid image", "may not be empty"}},
		{"image with a space", train(cmd, `  image = "bert latest"`), spec.Options{},
			[]string{"spec.hcl:3:11: error: Invalid image", `"bert latest" is not an image reference`}},
		{"image of the wrong type", train(cmd, `  image = ["a"]`), spec.Options{},
			[]string{"spec.hcl:3:11: error: Incorrect attribute value type", `"image"`}},
		{"image_pull without image", train(cmd, "  image_pull {", "    force = true", "  }"), spec.Options{},
			[]string{"spec.hcl:3:3: error: image_pull without image", `image = "REF"`}},
		{"image_pull with auth without image", train(cmd, "  image_pull {", "    auth {", `      username = "u"`, "    }", "  }"), spec.Options{},
			[]string{"spec.hcl:3:3: error: image_pull without image"}},
		{"image_pull with a null image", train(cmd, "  image = null", "  image_pull {", "  }"), spec.Options{},
			[]string{"spec.hcl:4:3: error: image_pull without image"}},
		{"bad image_pull timeout", train(cmd, `  image = "x"`, "  image_pull {", `    timeout = "5 minutes"`, "  }"), spec.Options{},
			[]string{"spec.hcl:5:15: error: Invalid duration", `image_pull.timeout "5 minutes" is not a duration`}},
		{"zero image_pull timeout", train(cmd, `  image = "x"`, "  image_pull {", `    timeout = "0s"`, "  }"), spec.Options{},
			[]string{"spec.hcl:5:15: error: Invalid duration", "positive"}},
		{"image_pull force not a bool", train(cmd, `  image = "x"`, "  image_pull {", `    force = "yes"`, "  }"), spec.Options{},
			[]string{"spec.hcl:5:13: error: Incorrect attribute value type", `"force"`, "a bool is required"}},
		{"unknown image_pull field", train(cmd, `  image = "x"`, "  image_pull {", `    force_pull = true`, "  }"), spec.Options{},
			[]string{"spec.hcl:5:5: error: Unsupported argument", `"force_pull"`}},
		{"unknown auth field", train(cmd, `  image = "x"`, "  image_pull {", "    auth {", `      email = "a@b"`, "    }", "  }"), spec.Options{},
			[]string{"spec.hcl:6:7: error: Unsupported argument", `"email"`}},
		{"auth field of the wrong type", train(cmd, `  image = "x"`, "  image_pull {", "    auth {", `      password = ["p"]`, "    }", "  }"), spec.Options{},
			[]string{"spec.hcl:6:18: error: Incorrect attribute value type", `"password"`}},
		{"duplicate image_pull", train(cmd, `  image = "x"`, "  image_pull {", "  }", "  image_pull {", "  }"), spec.Options{},
			[]string{"spec.hcl:6:3: error: Duplicate image_pull block"}},
		{"duplicate auth", train(cmd, `  image = "x"`, "  image_pull {", "    auth {", "    }", "    auth {", "    }", "  }"), spec.Options{},
			[]string{"spec.hcl:7:5: error: Duplicate auth block"}},
		{"reserved meta gpujob_task", train(cmd, `  meta = { gpujob_task = "x" }`), spec.Options{},
			[]string{"spec.hcl:3:10: error: Reserved meta key", `"gpujob_task"`}},
		{"reserved meta gpujob_run", train(cmd, `  meta = { gpujob_run = "x" }`), spec.Options{},
			[]string{"spec.hcl:3:10: error: Reserved meta key", `"gpujob_run"`, "gpujob_run"}},
		{"job name with space", "train \"my job\" {\n" + cmd + "\n}\n", spec.Options{},
			[]string{"spec.hcl:1:7: error: Invalid job name", `"my job" contains a space at byte 2`, "letters, digits"}},
		// Names that would escape the checkpoint root or break a Consul key
		// (issue 8).
		{"job name escaping the checkpoint root", "train \"../../../../../tmp/escaped\" {\n" + cmd + "\n}\n", spec.Options{},
			[]string{"spec.hcl:1:7: error: Invalid job name", "starts with '.'", "checkpoint root", "starting with a letter or a digit"}},
		{"job name with a slash", "train \"team/bert\" {\n" + cmd + "\n}\n", spec.Options{},
			[]string{"spec.hcl:1:7: error: Invalid job name", "'/' (a path separator) at byte 4"}},
		{"job name dot-dot", "train \"..\" {\n" + cmd + "\n}\n", spec.Options{},
			[]string{"spec.hcl:1:7: error: Invalid job name", "starts with '.'"}},
		{"job name with a percent escape", "train \"a%2Fb\" {\n" + cmd + "\n}\n", spec.Options{},
			[]string{"spec.hcl:1:7: error: Invalid job name", "'%' at byte 1"}},
		{"job name with a URL query", "train \"a?b#c\" {\n" + cmd + "\n}\n", spec.Options{},
			[]string{"spec.hcl:1:7: error: Invalid job name", "'?' at byte 1"}},
		{"job name with a newline escape", "train \"a\\nb\" {\n" + cmd + "\n}\n", spec.Options{},
			[]string{"spec.hcl:1:7: error: Invalid job name", `the control character '\n' at byte 1`}},
		{"job name with a NUL escape", "train \"a\\u0000\" {\n" + cmd + "\n}\n", spec.Options{},
			[]string{"spec.hcl:1:7: error: Invalid job name", `the control character '\x00' at byte 1`}},
		{"job name non-ASCII", "train \"données\" {\n" + cmd + "\n}\n", spec.Options{},
			[]string{"spec.hcl:1:7: error: Invalid job name", "the non-ASCII character 'é' at byte 4"}},
		{"job name like a flag", "train \"-rf\" {\n" + cmd + "\n}\n", spec.Options{},
			[]string{"spec.hcl:1:7: error: Invalid job name", "starts with '-'"}},
		{"job name too long", "train \"" + strings.Repeat("a", 129) + "\" {\n" + cmd + "\n}\n", spec.Options{},
			[]string{"spec.hcl:1:7: error: Invalid job name", "129 bytes long; the most is 128"}},
		{"empty job name", "train \"\" {\n" + cmd + "\n}\n", spec.Options{},
			[]string{"spec.hcl:1:7: error: Invalid job name", "is empty"}},
		{"syntax error", "train \"job\" {\n  command = \n}\n", spec.Options{},
			[]string{"spec.hcl:2:", "error:"}},
		{"unknown variable reference", train(cmd, "  workers = var.nope"), spec.Options{},
			[]string{"spec.hcl:3:16: error: Unsupported attribute", `"nope"`}},
		{"runtime variable not escaped", train(cmd, `  args = ["${NOMAD_ALLOC_INDEX}"]`), spec.Options{},
			[]string{"spec.hcl:3:14: error: Unknown variable", "$${NOMAD_ALLOC_INDEX}"}},

		// Variables.
		{"undeclared -var", minimal, spec.Options{Vars: []string{"workers=2"}},
			[]string{"<-var workers=2>:1:1: error: Undeclared variable", `"workers"`}},
		{"-var without =", minimal, spec.Options{Vars: []string{"workers"}},
			[]string{"<-var workers>:1:1: error: Invalid -var argument", "name=value"}},
		{"-var of the wrong type", "variable \"n\" {\n  type = number\n  default = 1\n}\n" + minimal,
			spec.Options{Vars: []string{"n=\"x\""}},
			[]string{`<-var n="x">:1:3: error: Invalid value for variable`, "a number is required"}},
		{"-var not an expression", "variable \"n\" {\n  type = number\n  default = 1\n}\n" + minimal,
			spec.Options{Vars: []string{"n=four"}},
			[]string{`<-var n=four>:1:3: error: Invalid value for variable`, `variable "n" is a number and "four" is not one`}},
		{"-var bad list", "variable \"l\" {\n  type = list(string)\n  default = []\n}\n" + minimal,
			spec.Options{Vars: []string{`l=["a",`}},
			[]string{`<-var l=["a",>:1:`, "error:"}},
		{"variable without value", "variable \"workers\" {\n  type = number\n}\n" + minimal, spec.Options{},
			[]string{"spec.hcl:1:1: error: No value for required variable", `"workers"`, "-var workers="}},
		{"bad default", "variable \"n\" {\n  type    = number\n  default = \"x\"\n}\n" + minimal, spec.Options{},
			[]string{"spec.hcl:3:13: error: Invalid default value for variable"}},
		{"bad type", "variable \"n\" {\n  type = integer\n}\n" + minimal, spec.Options{},
			[]string{"spec.hcl:2:10: error: Invalid type specification"}},
		{"variable with -var of bad value reaches train", "variable \"w\" {\n  type = number\n  default = 1\n}\n" +
			"train \"job\" {\n" + cmd + "\n  workers = var.w\n}\n", spec.Options{Vars: []string{"w=0"}},
			[]string{"spec.hcl:7:13: error: Invalid workers", "got 0"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr, errs := parse(t, c.src, c.o)
			if tr != nil || errs == "" {
				t.Fatalf("no error; parsed %+v", tr)
			}
			first := strings.SplitN(errs, "\n", 2)[0]
			if !strings.HasPrefix(first, c.want[0]) {
				t.Errorf("first diagnostic %q, want prefix %q; all:\n%s", first, c.want[0], errs)
			}
			for _, w := range c.want[1:] {
				if !strings.Contains(errs, w) {
					t.Errorf("diagnostics lack %q:\n%s", w, errs)
				}
			}
		})
	}
}

func TestVariablePrecedence(t *testing.T) {
	src := `
variable "workers" {
  type    = number
  default = 2
}
variable "script" {
  type    = string
  default = "a.py"
}
variable "extra" {
  type    = list(string)
  default = []
}
variable "labels" {
  type    = map(string)
  default = { team = "x" }
}
train "job" {
  workers = var.workers
  command = "/usr/bin/python3"
  args    = concat([var.script], var.extra)
  meta    = var.labels
}
`
	dir := t.TempDir()
	f1 := filepath.Join(dir, "a.hcl")
	f2 := filepath.Join(dir, "b.hcl")
	os.WriteFile(f1, []byte("workers = 3\nscript = \"b.py\"\n"), 0o644)
	os.WriteFile(f2, []byte("workers = 4\nextra = [\"--epochs\", \"1\"]\n"), 0o644)
	fj := filepath.Join(dir, "c.json")
	os.WriteFile(fj, []byte(`{"labels": {"team": "json"}}`), 0o644)

	for _, c := range []struct {
		name    string
		o       spec.Options
		workers int
		args    []string
		meta    map[string]string
	}{
		{"defaults", spec.Options{}, 2, []string{"a.py"}, map[string]string{"team": "x"}},
		{"var-file over default", spec.Options{VarFiles: []string{f1}}, 3, []string{"b.py"}, map[string]string{"team": "x"}},
		{"later var-file wins", spec.Options{VarFiles: []string{f1, f2}}, 4, []string{"b.py", "--epochs", "1"}, map[string]string{"team": "x"}},
		{"-var over var-file", spec.Options{VarFiles: []string{f1, f2}, Vars: []string{"workers=5"}}, 5, []string{"b.py", "--epochs", "1"}, map[string]string{"team": "x"}},
		{"later -var wins", spec.Options{Vars: []string{"workers=5", "workers=6"}}, 6, []string{"a.py"}, map[string]string{"team": "x"}},
		{"string -var takes raw text", spec.Options{Vars: []string{"script=c d=e.py"}}, 2, []string{"c d=e.py"}, map[string]string{"team": "x"}},
		{"list -var", spec.Options{Vars: []string{`extra=["-x"]`}}, 2, []string{"a.py", "-x"}, map[string]string{"team": "x"}},
		{"map -var and json var-file", spec.Options{VarFiles: []string{fj}, Vars: []string{`labels={team="y", a="b"}`}}, 2, []string{"a.py"}, map[string]string{"team": "y", "a": "b"}},
		{"json var-file", spec.Options{VarFiles: []string{fj}}, 2, []string{"a.py"}, map[string]string{"team": "json"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr, errs := parse(t, src, c.o)
			if errs != "" {
				t.Fatal(errs)
			}
			if tr.Workers != c.workers || !reflect.DeepEqual(tr.Args, c.args) || !reflect.DeepEqual(tr.Meta, c.meta) {
				t.Errorf("workers %d args %q meta %v; want %d %q %v", tr.Workers, tr.Args, tr.Meta, c.workers, c.args, c.meta)
			}
		})
	}

	t.Run("undeclared in var-file", func(t *testing.T) {
		bad := filepath.Join(dir, "bad.hcl")
		os.WriteFile(bad, []byte("workers = 3\n\nworkerz = 4\n"), 0o644)
		_, errs := parse(t, src, spec.Options{VarFiles: []string{bad}})
		if !strings.HasPrefix(errs, bad+":3:1: error: Undeclared variable") || !strings.Contains(errs, `did you mean "workers"?`) {
			t.Errorf("got:\n%s", errs)
		}
	})
	t.Run("wrong type in var-file", func(t *testing.T) {
		bad := filepath.Join(dir, "bad2.hcl")
		os.WriteFile(bad, []byte("workers = \"many\"\n"), 0o644)
		_, errs := parse(t, src, spec.Options{VarFiles: []string{bad}})
		if !strings.HasPrefix(errs, bad+":1:11: error: Invalid value for variable") {
			t.Errorf("got:\n%s", errs)
		}
	})
	t.Run("missing var-file", func(t *testing.T) {
		_, errs := parse(t, src, spec.Options{VarFiles: []string{filepath.Join(dir, "nope.hcl")}})
		if !strings.Contains(errs, "nope.hcl") || !strings.Contains(errs, "error:") {
			t.Errorf("got:\n%s", errs)
		}
	})
}

func TestParseFileAndFormatExcerpt(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "s.hcl")
	os.WriteFile(p, []byte(train2("  worker = 2")), 0o644)
	_, diags := spec.ParseFile(p, spec.Options{})
	if !diags.HasErrors() {
		t.Fatal("no error")
	}
	// With no files map, Format reads the source from disk.
	got := spec.Format(diags, nil)
	want := p + `:3:3: error: Unsupported argument: An argument named "worker" is not expected here. Did you mean "workers"?
    3 |   worker = 2
      |   ^^^^^^
`
	if got != want {
		t.Errorf("Format:\n%s\nwant:\n%s", got, want)
	}
	if _, diags := spec.ParseFile(filepath.Join(dir, "missing.hcl"), spec.Options{}); !diags.HasErrors() {
		t.Error("missing file parsed")
	}
}

func train2(line string) string {
	return "train \"job\" {\n  command = \"/bin/true\"\n" + line + "\n}\n"
}

func TestFormatWithoutSubjectOrSource(t *testing.T) {
	diags := hcl.Diagnostics{
		{Severity: hcl.DiagError, Summary: "Boom", Detail: "line one\nline two"},
		{Severity: hcl.DiagWarning, Summary: "Careful", Subject: &hcl.Range{Filename: "/nonexistent/x.hcl", Start: hcl.Pos{Line: 2, Column: 4}}},
	}
	want := "error: Boom: line one line two\n/nonexistent/x.hcl:2:4: warning: Careful\n"
	if got := spec.Format(diags, nil); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestCheckFits(t *testing.T) {
	src := "train \"job\" {\n  command = \"/bin/true\"\n  gpus_per_worker = 4\n}\n"
	tr, files, diags := spec.LoadSource([]byte(src), "spec.hcl", spec.Options{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	if d := spec.CheckFits(tr, 4); d.HasErrors() {
		t.Errorf("4 GPUs fit a 4-GPU node: %v", d)
	}
	d := spec.CheckFits(tr, 2)
	got := spec.Format(d, files)
	if !strings.HasPrefix(got, "spec.hcl:3:21: error: Spec cannot fit the cluster: gpus_per_worker = 4, but no node holds more than 2") {
		t.Errorf("got:\n%s", got)
	}
	if got := spec.Format(spec.CheckFits(tr, 0), files); !strings.Contains(got, "no node in the cluster has an nvidia/gpu device") {
		t.Errorf("got:\n%s", got)
	}
	// Defaulted gpus_per_worker (1) points at the train block.
	tr2, _ := spec.Parse([]byte(minimal), "spec.hcl", spec.Options{})
	if got := spec.Format(spec.CheckFits(tr2, 0), nil); !strings.HasPrefix(got, "spec.hcl:1:1: error") {
		t.Errorf("got:\n%s", got)
	}
	cpu := "train \"job\" {\n  command = \"/bin/true\"\n  gpus_per_worker = 0\n}\n"
	tr3, _ := spec.Parse([]byte(cpu), "spec.hcl", spec.Options{})
	if d := spec.CheckFits(tr3, 0); d.HasErrors() {
		t.Errorf("a CPU job fits a cluster without GPUs: %v", d)
	}
}

func TestParseMemory(t *testing.T) {
	for in, want := range map[string]int{
		"16 GiB": 16384, "16GiB": 16384, "512 MiB": 512, "1.5 GiB": 1536,
		"16 GB": 15259, "1000 MB": 954, " 8 GiB ": 8192,
	} {
		got, err := spec.ParseMemory(in)
		if err != nil || got != want {
			t.Errorf("ParseMemory(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "GiB", "16", "16 gigs", "0 GiB", "-1 GiB", "1.2.3 GiB"} {
		if got, err := spec.ParseMemory(in); err == nil {
			t.Errorf("ParseMemory(%q) = %d, want an error", in, got)
		}
	}
}

func TestExamples(t *testing.T) {
	paths, _ := filepath.Glob("../../jobspecs/examples/*.hcl")
	n := 0
	for _, p := range paths {
		if strings.HasSuffix(p, ".nomad.hcl") {
			continue
		}
		n++
		parse := func() hcl.Diagnostics { _, d := spec.ParseFile(p, spec.Options{}); return d }
		if strings.HasPrefix(filepath.Base(p), "sweep-") {
			parse = func() hcl.Diagnostics { _, d := spec.ParseSweepFile(p, spec.Options{}); return d }
		}
		if strings.HasPrefix(filepath.Base(p), "serve-") {
			parse = func() hcl.Diagnostics { _, d := spec.ParseServiceFile(p, spec.Options{}); return d }
		}
		if diags := parse(); diags.HasErrors() {
			t.Errorf("%s:\n%s", p, spec.Format(diags, nil))
		}
	}
	if n < 3 {
		t.Errorf("want >= 3 example specs, got %d", n)
	}
	tr, diags := spec.ParseFile("../../jobspecs/examples/bert-finetune.hcl", spec.Options{})
	if diags.HasErrors() {
		t.Fatal(spec.Format(diags, nil))
	}
	if tr.Workers != 2 || tr.GPUsPerWorker != 1 || tr.Command != "/usr/bin/python3" ||
		!reflect.DeepEqual(tr.Args, []string{"/opt/gpujob/workloads/bert_finetune.py"}) ||
		tr.CheckpointEvery != 20 || tr.MaxFailures != 3 {
		t.Errorf("bert-finetune example: %+v", tr)
	}
}

func TestJSONSpec(t *testing.T) {
	src := `{"variable": {"w": {"type": "number", "default": 2}},
 "train": {"j": {"command": "/bin/true", "workers": "${var.w}", "resources": {"shm": 64}}}}`
	tr, files, diags := spec.LoadSource([]byte(src), "spec.json", spec.Options{Vars: []string{"w=3"}})
	if diags.HasErrors() {
		t.Fatal(spec.Format(diags, files))
	}
	if tr.Name != "j" || tr.Workers != 3 || tr.Resources.ShmMiB != 64 {
		t.Errorf("%+v", tr)
	}
	_, files, diags = spec.LoadSource([]byte(`{"train": {"j": {"command": "/bin/true", "workers": 0}}}`), "spec.json", spec.Options{})
	if got := spec.Format(diags, files); !strings.HasPrefix(got, "spec.json:1:53: error: Invalid workers") {
		t.Errorf("got:\n%s", got)
	}
}
