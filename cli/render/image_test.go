package render_test

import (
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclwrite"

	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/internal/contract"
)

// node is a rendered block: its attributes' expressions as written, and
// its nested blocks in order.
type node struct {
	typ    string
	labels []string
	attrs  map[string]string
	blocks []*node
}

func parseRendered(t *testing.T, src []byte) *node {
	t.Helper()
	f, diags := hclwrite.ParseConfig(src, "rendered.nomad.hcl", hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatalf("%v\n%s", diags, src)
	}
	return toNode("", nil, f.Body())
}

func toNode(typ string, labels []string, b *hclwrite.Body) *node {
	n := &node{typ: typ, labels: labels, attrs: map[string]string{}}
	for name, a := range b.Attributes() {
		n.attrs[name] = strings.TrimSpace(string(a.Expr().BuildTokens(nil).Bytes()))
	}
	for _, blk := range b.Blocks() {
		n.blocks = append(n.blocks, toNode(blk.Type(), blk.Labels(), blk.Body()))
	}
	return n
}

// all returns the nested blocks of type typ.
func (n *node) all(typ string) []*node {
	var out []*node
	for _, b := range n.blocks {
		if b.typ == typ {
			out = append(out, b)
		}
	}
	return out
}

// one returns the only nested block of type typ, failing the test unless
// there is exactly one.
func (n *node) one(t *testing.T, typ string) *node {
	t.Helper()
	bs := n.all(typ)
	if len(bs) != 1 {
		t.Fatalf("%s %v has %d %s blocks, want 1", n.typ, n.labels, len(bs), typ)
	}
	return bs[0]
}

func (n *node) want(t *testing.T, attrs map[string]string) {
	t.Helper()
	for k, v := range attrs {
		got, ok := n.attrs[k]
		switch {
		case v == "" && ok:
			t.Errorf("%s %v: unexpected %s = %s", n.typ, n.labels, k, got)
		case v != "" && got != v:
			t.Errorf("%s %v: %s = %q, want %q", n.typ, n.labels, k, got, v)
		}
	}
}

const imageSpec = `train "bert" {
  workers         = 3
  gpus_per_worker = 2
  namespace       = "ml"
  image           = "registry.example.com/ml/bert:1.4"
  image_pull {
    force   = true
    timeout = "10m"
    auth {
      username       = "robot"
      password       = "s3cret"
      server_address = "registry.example.com"
    }
  }
  command = "/usr/bin/python3"
  args    = ["-u", "train.py", "$${NOMAD_ALLOC_INDEX}"]
  preload = ["torch"]
  workdir = "/work"
  env     = { NCCL_DEBUG = "WARN" }
  artifact {
    source      = "https://example.com/code.tar.gz"
    destination = "local/code"
  }
  resources {
    cpu    = 4000
    memory = 4096
    shm    = 1024
  }
  gpu {
    model = "Tesla T4"
  }
  checkpoint {
    every = 20
  }
  max_failures = 2
}`

func TestImageJobspec(t *testing.T) {
	out, err := render.Options{CheckpointRoot: "/data/ckpt/"}.Jobspec(mustParse(t, imageSpec))
	if err != nil {
		t.Fatal(err)
	}
	job := parseRendered(t, out).one(t, "job")
	job.want(t, map[string]string{"namespace": `"ml"`, "type": `"batch"`})
	for _, m := range []string{`gpujob_task            = "train"`, `gpujob_run             = ""`, `gpujob_workers         = "3"`} {
		if !strings.Contains(job.attrs["meta"], m) {
			t.Errorf("meta lacks %s:\n%s", m, job.attrs["meta"])
		}
	}
	group := job.one(t, "group")
	group.want(t, map[string]string{"count": "3"})
	if group.one(t, "network").one(t, "port").labels[0] != render.Port {
		t.Error("no rendezvous port")
	}
	group.one(t, "restart").want(t, map[string]string{"attempts": "0", "mode": `"fail"`})
	group.one(t, "reschedule").want(t, map[string]string{"attempts": "0", "unlimited": "false"})

	tasks := group.all("task")
	if len(tasks) != 2 || tasks[0].labels[0] != render.Sidecar || tasks[1].labels[0] != render.Task {
		t.Fatalf("tasks %v, want the sidecar %q then the member %q", tasks, render.Sidecar, render.Task)
	}
	sidecar, member := tasks[0], tasks[1]

	// The sidecar: today's gpujob task config, and what the container
	// member adds.
	sidecar.want(t, map[string]string{"driver": `"gpujob"`, "kill_timeout": `"30s"`})
	sidecar.one(t, "lifecycle").want(t, map[string]string{"hook": `"prestart"`, "sidecar": "true"})
	cfg := sidecar.one(t, "config")
	cfg.want(t, map[string]string{
		"command": `"/usr/bin/python3"`, "args": `["-u", "train.py", "$${NOMAD_ALLOC_INDEX}"]`,
		"preload": `["torch"]`, "workdir": `"/work"`, "max_restarts": "2",
		"nproc_per_node": "2", "container_task": `"train"`, "checkpoint_root": `"/data/ckpt"`,
	})
	for _, e := range []string{`NCCL_DEBUG              = "WARN"`, `GPUJOB_CHECKPOINT_EVERY = "20"`} {
		if !strings.Contains(cfg.attrs["env"], e) {
			t.Errorf("sidecar env lacks %s: %s", e, cfg.attrs["env"])
		}
	}
	cfg.one(t, "rendezvous").want(t, map[string]string{"nnodes": `"3"`, "port": `"rdzv"`, "join_timeout": `"5m"`})
	res := sidecar.one(t, "resources")
	res.want(t, map[string]string{"cpu": "50", "memory": "64"})
	if len(res.blocks) != 0 || len(sidecar.all("artifact")) != 0 {
		t.Errorf("the sidecar holds devices %v or artifacts %v", res.blocks, sidecar.all("artifact"))
	}

	// The member: the supervisor in the image, on docker.
	member.want(t, map[string]string{"driver": `"docker"`, "kill_timeout": `"30s"`, "user": `"0"`})
	if len(member.all("lifecycle")) != 0 {
		t.Error("the member task has a lifecycle")
	}
	dc := member.one(t, "config")
	dc.want(t, map[string]string{
		"image": `"registry.example.com/ml/bert:1.4"`, "entrypoint": `["/gpujob/supervisor", "/gpujob/spec.json"]`, "command": "", "args": "",
		"network_mode": `"host"`, "init": "true", "force_pull": "true", "image_pull_timeout": `"10m"`,
		"shm_size": "1073741824", // 1024 MiB in bytes
		// Not the host member's config.
		"env": "", "max_restarts": "", "nproc_per_node": "",
	})
	dc.one(t, "auth").want(t, map[string]string{
		"username": `"robot"`, "password": `"s3cret"`, "server_address": `"registry.example.com"`,
	})
	mounts := dc.all("mount")
	if len(mounts) != 2 {
		t.Fatalf("%d mounts, want 2", len(mounts))
	}
	mounts[0].want(t, map[string]string{
		"type": `"bind"`, "source": `"/run/gpujob/${NOMAD_ALLOC_ID}"`, "target": `"/gpujob"`, "readonly": "true",
	})
	ckpt := `"/data/ckpt/${NOMAD_NAMESPACE}/${NOMAD_JOB_ID}/${NOMAD_META_gpujob_run}"`
	mounts[1].want(t, map[string]string{"type": `"bind"`, "source": ckpt, "target": ckpt, "readonly": "false"})
	art := member.one(t, "artifact")
	art.want(t, map[string]string{"source": `"https://example.com/code.tar.gz"`, "destination": `"local/code"`})
	res = member.one(t, "resources")
	// shm is docker's shm_size, not memory.
	res.want(t, map[string]string{"cpu": "4000", "memory": "4096"})
	dev := res.one(t, "device")
	if dev.labels[0] != render.Device || dev.attrs["count"] != "2" || len(dev.all("constraint")) != 1 {
		t.Errorf("device %+v", dev)
	}
}

func TestImageJobspecVariants(t *testing.T) {
	for _, c := range []struct {
		name      string
		src       string
		o         render.Options
		want, not []string
	}{
		{
			name: "CPU image job: one rank, no GPUs, no shm",
			src:  "train \"x\" {\n  command = \"/bin/true\"\n  image = \"busybox\"\n  gpus_per_worker = 0\n}",
			want: []string{`nproc_per_node  = 1`, `checkpoint_root = "/var/lib/gpujob/checkpoints"`, `memory = 2048`,
				`source   = "/var/lib/gpujob/checkpoints/${NOMAD_NAMESPACE}/${NOMAD_JOB_ID}/${NOMAD_META_gpujob_run}"`},
			not: []string{"device", "shm_size", "force_pull", "image_pull_timeout", "auth"},
		},
		{
			name: "image_pull without auth, force false",
			src:  "train \"x\" {\n  command = \"/bin/true\"\n  image = \"busybox\"\n  image_pull {\n    force = false\n    timeout = \"90s\"\n  }\n}",
			want: []string{`image_pull_timeout = "1m30s"`},
			not:  []string{"force_pull", "auth"},
		},
		{
			name: "an empty auth block writes none",
			src:  "train \"x\" {\n  command = \"/bin/true\"\n  image = \"busybox\"\n  image_pull {\n    auth {\n    }\n  }\n}",
			not:  []string{"auth", "image_pull_timeout"},
		},
		{
			name: "auth with a username only",
			src:  "train \"x\" {\n  command = \"/bin/true\"\n  image = \"busybox\"\n  image_pull {\n    auth {\n      username = \"u\"\n    }\n  }\n}",
			want: []string{"auth {\n          username = \"u\"\n        }"},
			not:  []string{"password", "server_address"},
		},
		{
			name: "the checkpoint root option",
			src:  "train \"x\" {\n  command = \"/bin/true\"\n  image = \"busybox\"\n}",
			o:    render.Options{CheckpointRoot: "/mnt//ckpt/./x/.."},
			want: []string{`checkpoint_root = "/mnt/ckpt"`, `"/mnt/ckpt/${NOMAD_NAMESPACE}/${NOMAD_JOB_ID}/${NOMAD_META_gpujob_run}"`},
		},
		{
			name: "a host job ignores the checkpoint root and keeps shm in memory",
			src:  "train \"x\" {\n  command = \"/bin/true\"\n  resources {\n    memory = 4096\n    shm = 1024\n  }\n}",
			o:    render.Options{CheckpointRoot: "/mnt/ckpt"},
			want: []string{`memory = 5120`, `gpujob_task            = "train"`, `task "train" {`, `driver       = "gpujob"`},
			not:  []string{"gpujob_run", "docker", "lifecycle", "container_task", "checkpoint_root", "nproc_per_node", "/mnt/ckpt", "shm_size", "mount"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, err := c.o.Jobspec(mustParse(t, c.src))
			if err != nil {
				t.Fatal(err)
			}
			checkJobspecText(t, string(out), c.want, c.not)
		})
	}
}

func TestCheckpointRoot(t *testing.T) {
	for root, want := range map[string]string{
		"":                      contract.DefaultCheckpointRoot,
		"/srv/ckpt/":            "/srv/ckpt",
		"/srv//a/../ckpt":       "/srv/ckpt",
		"/with space/ünïcode":   "/with space/ünïcode",
		"/var/lib/gpujob/ckpts": "/var/lib/gpujob/ckpts",
	} {
		if got, err := render.CheckpointRoot(root); err != nil || got != want {
			t.Errorf("CheckpointRoot(%q) = %q, %v; want %q", root, got, err, want)
		}
	}
	tr := mustParse(t, "train \"x\" {\n  command = \"/bin/true\"\n  image = \"busybox\"\n}")
	for _, root := range []string{"relative/ckpt", "./ckpt", "/ckpt/${NOMAD_JOB_ID}", "/ckpt/%{ if true }x%{ endif }", "/ckpt\n", "/ckpt/\x00", "/ckpt/\xff"} {
		if _, err := render.CheckpointRoot(root); err == nil {
			t.Errorf("CheckpointRoot(%q) accepted", root)
		}
		if _, err := (render.Options{CheckpointRoot: root}).Jobspec(tr); err == nil || !strings.Contains(err.Error(), "checkpoint root") {
			t.Errorf("Jobspec with checkpoint root %q: %v, want an error naming the checkpoint root", root, err)
		}
	}
}

func TestJobspecRefusesImagePullWithoutImage(t *testing.T) {
	tr := &spec.Train{Name: "x", Command: "/bin/true", Workers: 1, ImagePull: &spec.ImagePull{Force: true}}
	if _, err := render.Jobspec(tr); err == nil || !strings.Contains(err.Error(), "image_pull") {
		t.Errorf("a Train with image_pull and no image: %v", err)
	}
}
