package spec_test

import (
	"os"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/hashicorp/hcl/v2/hclwrite"
	"github.com/zclconf/go-cty/cty"

	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/internal/ctyval"
)

// FuzzParse feeds the spec parser a spec (HCL, or JSON when asJSON) and
// one -var argument. It must never crash; every error must come out of
// Format as one line naming its place; and a spec it accepts must be
// valid (what validate promises render and submit) and survive a round
// trip: written back as HCL with hclwrite, it parses to the same Train.
func FuzzParse(f *testing.F) {
	examples, _ := filepath.Glob("../../jobspecs/examples/*.hcl")
	for _, p := range examples {
		if strings.HasSuffix(p, ".nomad.hcl") {
			continue
		}
		if src, err := os.ReadFile(p); err == nil {
			f.Add(string(src), "", false)
			f.Add(string(src), "workers=4", false)
		}
	}
	for _, s := range []struct {
		src, v string
		json   bool
	}{
		{minimal, "", false},
		{issueSweep, "", false},
		{`variable "n" {
  type = number
  default = 2
}
train "x" {
  workers = var.n
  command = "/bin/${var.n}"
  args    = ["$${NOMAD_ALLOC_INDEX}", "%{ if true }y%{ endif }"]
  env     = { A = "1", "B_2" = 2 }
  meta    = { "a b" = "c" }
  artifact {
    source  = "https://e/x"
    options = { checksum = "sha256:0" }
  }
  resources {
    memory = 4096
    shm    = 512
  }
  gpu {
    min_memory = "1.5 GiB"
  }
  checkpoint {
    every = 5
  }
}`, "n=3", false},
		{`variable "image" {
  default = "gpujob-train:latest"
}
train "x" {
  command = "/usr/bin/python3"
  args    = ["-u", "t.py"]
  image   = var.image
  preload = ["torch"]
  image_pull {
    force   = true
    timeout = "90s"
    auth {
      username       = "u"
      password       = "$${P}"
      server_address = "r.example.com"
    }
  }
  resources {
    shm = 64
  }
}`, "image=r.example.com/a/b@sha256:00", false},
		{"train \"x\" {\n  command = \"a\"\n  image_pull {\n  }\n}\n", "", false},
		{"train \"x\" {\n  command = \"a\"\n  image = \"b\"\n  image_pull {\n    timeout = \"-1s\"\n    auth {\n    }\n  }\n}\n", "", false},
		{`{"train": {"j": {"command": "/bin/true", "image": "busybox", "image_pull": {"force": true, "auth": {"username": "u"}}}}}`, "", true},
		{`{"train": {"j": {"command": "/bin/true", "workers": 2}}}`, "", true},
		{`{"variable": {"w": {"default": 1}}, "train": {"j": {"command": "/bin/true", "workers": "${var.w}"}}}`, "w=2", true},
		{"train \"x\" {\n  command = \"/bin/true\"\n  workers = 100000000000\n}\n", "", false},
		{"train \"x y\" {\n  command = \"a\"\n}\n", "", false},
		{"train \"\" {\n  command = \"a\"\n}\n", "", false},
		{"variable \"w\" {\n  type = number\n}\ntrain \"x\" {\n  command = \"a\"\n  workers = var.w\n}\n", "w=[1]", false},
		{"variable \"w\" {}\ntrain \"x\" {\n  command = var.w\n}\n", "w\n=\x00", false},
		{"train \"x\" {\n  command = \"a\"\n  rendezvous_timeout = \"1.5ns\"\n}\n", "", false},
		{"train \"x\" {\n  command = \"\\u00e9\\t\\n\"\n  workdir = \"/a/../..\"\n}\n", "", false},
		{"train \"x\" {\n  command = \"a\"\n  gpus_per_worker = 0\n  gpu {}\n}\n", "", false},
		{"train \"x\" {\n  command = \"a\"\n  env = { \"\" = 1 }\n}\n", "", false},
	} {
		f.Add(s.src, s.v, s.json)
	}
	f.Fuzz(func(t *testing.T, src, varArg string, asJSON bool) {
		filename := "spec.hcl"
		if asJSON {
			filename = "spec.json"
		}
		var o spec.Options
		if varArg != "" {
			o.Vars = []string{varArg}
		}
		tr, files, diags := spec.LoadSource([]byte(src), filename, o)
		if diags.HasErrors() {
			if tr != nil {
				t.Fatal("a spec with errors returned a Train")
			}
			checkFormat(t, diags, files)
			return
		}
		if tr == nil {
			t.Fatalf("no errors and no Train: %v", diags)
		}
		checkTrain(t, tr)
		out := encode(tr)
		back, files, diags := spec.LoadSource(out, "again.hcl", spec.Options{})
		if diags.HasErrors() {
			t.Fatalf("the accepted spec, written back, does not parse:\n%s\n%s", out, spec.Format(diags, files))
		}
		tr.Ranges, back.Ranges = spec.Ranges{}, spec.Ranges{}
		if !reflect.DeepEqual(tr, back) {
			t.Fatalf("round trip changed the spec:\n got %#v\nwant %#v\nvia:\n%s", back, tr, out)
		}
	})
}

// checkFormat: one line per diagnostic, each starting with file:line:col
// when the diagnostic has a place; the source excerpts are indented.
func checkFormat(t *testing.T, diags hcl.Diagnostics, files map[string]*hcl.File) {
	t.Helper()
	out := spec.Format(diags, files)
	var heads []string
	for _, l := range strings.SplitAfter(out, "\n") {
		if l != "" && !strings.HasPrefix(l, " ") {
			heads = append(heads, l)
		}
	}
	if len(heads) != len(diags) {
		t.Fatalf("%d diagnostics formatted as %d lines:\n%s", len(diags), len(heads), out)
	}
	for i, d := range diags {
		sev := "error: "
		if d.Severity == hcl.DiagWarning {
			sev = "warning: "
		}
		head := heads[i]
		if d.Subject != nil {
			var ok bool
			// Control characters in the name (a -var's) come out escaped.
			name := d.Subject.Filename
			if !utf8.ValidString(name) || strings.IndexFunc(name, unicode.IsControl) >= 0 {
				name = strconv.Quote(name)
				name = name[1 : len(name)-1]
			}
			if head, ok = strings.CutPrefix(head, name+":"); ok {
				head = position.ReplaceAllString(head, "")
			}
		}
		if !strings.HasPrefix(head, sev) {
			t.Fatalf("diagnostic %d formatted as %q, want it to start with file:line:col: %s", i, heads[i], sev)
		}
	}
}

var (
	position  = regexp.MustCompile(`^\d+:\d+: `)
	envName   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	namespace = regexp.MustCompile(`^[a-zA-Z0-9-]{1,128}$`)
	nodePool  = regexp.MustCompile(`^[a-zA-Z0-9-_]{1,128}$`)
)

// checkTrain asserts what the parser promises of an accepted spec.
func checkTrain(t *testing.T, tr *spec.Train) {
	t.Helper()
	bad := func(format string, args ...any) { t.Helper(); t.Fatalf("accepted "+format, args...) }
	if tr.Name == "" || strings.IndexFunc(tr.Name, func(r rune) bool { return r == 0 || r == ' ' || r == '\t' || r == '\n' }) >= 0 {
		bad("job name %q", tr.Name)
	}
	if tr.Workers < 1 || tr.Workers > spec.MaxWorkers {
		bad("workers = %d", tr.Workers)
	}
	if tr.GPUsPerWorker < 0 || tr.GPU != nil && tr.GPUsPerWorker == 0 || tr.GPU != nil && tr.GPU.MinMemoryMiB < 0 {
		bad("gpus_per_worker = %d with gpu %+v", tr.GPUsPerWorker, tr.GPU)
	}
	if strings.TrimSpace(tr.Command) == "" {
		bad("command %q", tr.Command)
	}
	if tr.Workdir != "" && !path.IsAbs(tr.Workdir) {
		bad("workdir %q", tr.Workdir)
	}
	if tr.MaxFailures < 0 || tr.RendezvousTimeout <= 0 || tr.CheckpointEvery < 0 {
		bad("max_failures %d, rendezvous_timeout %s, checkpoint every %d", tr.MaxFailures, tr.RendezvousTimeout, tr.CheckpointEvery)
	}
	if tr.Priority < spec.MinPriority || tr.Priority > spec.MaxPriority {
		bad("priority %d", tr.Priority)
	}
	if r := tr.Resources; r.CPU < spec.MinCPU || r.MemoryMiB < spec.MinMemoryMiB || r.ShmMiB < 0 || r.TaskMemoryMiB() < r.MemoryMiB {
		bad("resources %+v", r)
	}
	if len(tr.Datacenters) == 0 || tr.NodePool != "" && !nodePool.MatchString(tr.NodePool) || tr.Namespace != "" && !namespace.MatchString(tr.Namespace) {
		bad("datacenters %q, node_pool %q, namespace %q", tr.Datacenters, tr.NodePool, tr.Namespace)
	}
	for _, dc := range tr.Datacenters {
		if dc == "" {
			bad("an empty datacenter")
		}
	}
	for k := range tr.Env {
		if !envName.MatchString(k) {
			bad("env name %q", k)
		}
	}
	if _, ok := tr.Env[spec.EnvCheckpointEvery]; ok && tr.CheckpointEvery > 0 {
		bad("env %s next to checkpoint { every }", spec.EnvCheckpointEvery)
	}
	for k := range tr.Meta {
		if k == "gpujob" || strings.HasPrefix(k, "gpujob_") {
			bad("reserved meta key %q", k)
		}
	}
	if tr.Image != "" && (strings.TrimSpace(tr.Image) == "" || strings.IndexFunc(tr.Image, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0) {
		bad("image %q", tr.Image)
	}
	if p := tr.ImagePull; p != nil && (tr.Image == "" || p.Timeout < 0) {
		bad("image_pull %+v with image %q", p, tr.Image)
	}
	for _, a := range tr.Artifacts {
		if a.Source == "" {
			bad("an artifact without source")
		}
		for k := range a.Options {
			if !hclsyntax.ValidIdentifier(k) {
				bad("artifact option %q", k)
			}
		}
	}
}

// encode writes tr back as a spec, every field explicit.
func encode(tr *spec.Train) []byte {
	f := hclwrite.NewEmptyFile()
	b := f.Body().AppendNewBlock("train", []string{tr.Name}).Body()
	num := func(n int) cty.Value { return cty.NumberIntVal(int64(n)) }
	b.SetAttributeValue("workers", num(tr.Workers))
	b.SetAttributeValue("gpus_per_worker", num(tr.GPUsPerWorker))
	b.SetAttributeValue("command", cty.StringVal(tr.Command))
	if tr.Args != nil {
		b.SetAttributeValue("args", ctyval.Strings(tr.Args))
	}
	if tr.Env != nil {
		b.SetAttributeValue("env", ctyval.StringMap(tr.Env))
	}
	if tr.Workdir != "" {
		b.SetAttributeValue("workdir", cty.StringVal(tr.Workdir))
	}
	if tr.Preload != nil {
		b.SetAttributeValue("preload", ctyval.Strings(tr.Preload))
	}
	if tr.Image != "" {
		b.SetAttributeValue("image", cty.StringVal(tr.Image))
	}
	if p := tr.ImagePull; p != nil {
		pb := b.AppendNewBlock("image_pull", nil).Body()
		pb.SetAttributeValue("force", cty.BoolVal(p.Force))
		if p.Timeout != 0 {
			pb.SetAttributeValue("timeout", cty.StringVal(p.Timeout.String()))
		}
		if a := p.Auth; a != nil {
			ab := pb.AppendNewBlock("auth", nil).Body()
			ab.SetAttributeValue("username", cty.StringVal(a.Username))
			ab.SetAttributeValue("password", cty.StringVal(a.Password))
			ab.SetAttributeValue("server_address", cty.StringVal(a.ServerAddress))
		}
	}
	b.SetAttributeValue("max_failures", num(tr.MaxFailures))
	b.SetAttributeValue("rendezvous_timeout", cty.StringVal(tr.RendezvousTimeout.String()))
	b.SetAttributeValue("datacenters", ctyval.Strings(tr.Datacenters))
	if tr.NodePool != "" {
		b.SetAttributeValue("node_pool", cty.StringVal(tr.NodePool))
	}
	if tr.Namespace != "" {
		b.SetAttributeValue("namespace", cty.StringVal(tr.Namespace))
	}
	b.SetAttributeValue("priority", num(tr.Priority))
	if tr.Meta != nil {
		b.SetAttributeValue("meta", ctyval.StringMap(tr.Meta))
	}
	for _, a := range tr.Artifacts {
		ab := b.AppendNewBlock("artifact", nil).Body()
		ab.SetAttributeValue("source", cty.StringVal(a.Source))
		if a.Destination != "" {
			ab.SetAttributeValue("destination", cty.StringVal(a.Destination))
		}
		if a.Options != nil {
			ab.SetAttributeValue("options", ctyval.StringMap(a.Options))
		}
	}
	rb := b.AppendNewBlock("resources", nil).Body()
	rb.SetAttributeValue("cpu", num(tr.Resources.CPU))
	rb.SetAttributeValue("memory", num(tr.Resources.MemoryMiB))
	rb.SetAttributeValue("shm", num(tr.Resources.ShmMiB))
	if tr.GPU != nil {
		gb := b.AppendNewBlock("gpu", nil).Body()
		if tr.GPU.Model != "" {
			gb.SetAttributeValue("model", cty.StringVal(tr.GPU.Model))
		}
		if tr.GPU.MinMemoryMiB > 0 {
			gb.SetAttributeValue("min_memory", cty.StringVal(strconv.Itoa(tr.GPU.MinMemoryMiB)+" MiB"))
		}
	}
	if tr.CheckpointEvery > 0 {
		b.AppendNewBlock("checkpoint", nil).Body().SetAttributeValue("every", num(tr.CheckpointEvery))
	}
	return f.Bytes()
}
