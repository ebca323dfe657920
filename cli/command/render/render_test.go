package render_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpujob/gpujob/cli/command/render"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/iostreams"
	"github.com/gpujob/gpujob/cli/nomadapi"
)

const example = "../../../jobspecs/examples/bert-finetune.hcl"

func execute(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	io, _, out, errOut := iostreams.Test()
	f := &factory.Factory{IO: io, Nomad: func() (nomadapi.API, error) {
		t.Fatal("render asked for the Nomad API: it must work offline")
		return nil, nil
	}}
	cmd := render.NewCmd(f)
	cmd.SetArgs(args)
	cmd.SetOut(out)
	cmd.SetErr(errOut)
	err := cmd.Execute()
	return out.String(), errOut.String(), err
}

func TestRenderMatchesGolden(t *testing.T) {
	out, errOut, err := execute(t, example)
	if err != nil || errOut != "" {
		t.Fatalf("err %v, stderr %q", err, errOut)
	}
	golden, err := os.ReadFile("../../../jobspecs/rendered/bert-finetune.nomad.hcl")
	if err != nil {
		t.Fatal(err)
	}
	if out != string(golden) {
		t.Errorf("render output differs from the golden file:\n%s", out)
	}
}

// TestRenderImage: an image spec renders to its golden file with the
// default checkpoint root, and with the clients' root from the environment
// or --checkpoint-root (which wins) otherwise.
func TestRenderImage(t *testing.T) {
	const spec = "../../../jobspecs/examples/bert-image.hcl"
	t.Setenv("GPUJOB_CHECKPOINT_ROOT", "")
	out, errOut, err := execute(t, spec)
	if err != nil || errOut != "" {
		t.Fatalf("err %v, stderr %q", err, errOut)
	}
	golden, err := os.ReadFile("../../../jobspecs/rendered/bert-image.nomad.hcl")
	if err != nil {
		t.Fatal(err)
	}
	if out != string(golden) {
		t.Errorf("render output differs from the golden file:\n%s", out)
	}
	for _, c := range []struct {
		env  string
		args []string
		root string
	}{
		{"/srv/ckpt", nil, "/srv/ckpt"},
		{"/srv/ckpt/", nil, "/srv/ckpt"},
		{"/srv/ckpt", []string{"--checkpoint-root", "/data/ckpt"}, "/data/ckpt"},
		{"", []string{"--checkpoint-root=/data/ckpt"}, "/data/ckpt"},
	} {
		t.Setenv("GPUJOB_CHECKPOINT_ROOT", c.env)
		out, _, err := execute(t, append(c.args, spec)...)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{`checkpoint_root = "` + c.root + `"`,
			`source   = "` + c.root + `/${NOMAD_NAMESPACE}/${NOMAD_JOB_ID}/${NOMAD_META_gpujob_run}"`} {
			if !strings.Contains(out, want) {
				t.Errorf("env %q, args %q: missing %s in\n%s", c.env, c.args, want, out)
			}
		}
	}
	// A root the driver could not have is refused, naming where it came from.
	for _, c := range []struct {
		env  string
		args []string
		want string
	}{
		{"relative", nil, `GPUJOB_CHECKPOINT_ROOT: checkpoint root "relative" must be an absolute path`},
		{"", []string{"--checkpoint-root", "rel/x"}, `--checkpoint-root: checkpoint root "rel/x" must be an absolute path`},
		{"", []string{"--checkpoint-root", "/x/${NOMAD_JOB_ID}"}, "--checkpoint-root: checkpoint root"},
	} {
		t.Setenv("GPUJOB_CHECKPOINT_ROOT", c.env)
		out, _, err := execute(t, append(c.args, spec)...)
		if err == nil || !strings.Contains(err.Error(), c.want) || out != "" {
			t.Errorf("env %q, args %q: err %v, want %q; stdout %q", c.env, c.args, err, c.want, out)
		}
	}
}

func TestRenderVars(t *testing.T) {
	dir := t.TempDir()
	vf := filepath.Join(dir, "v.hcl")
	os.WriteFile(vf, []byte("workers = 3\nworkload = \"/shared/w.py\"\n"), 0o644)
	out, _, err := execute(t, "--var-file", vf, "--var", "workers=4", "--var", `args=["--epochs","1"]`, example)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`count = 4`, `nnodes       = "4"`, `args         = ["/shared/w.py", "--epochs", "1"]`} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
}

func TestRenderOutputFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "job.nomad.hcl")
	out, _, err := execute(t, example, "-o", path)
	if err != nil || out != "" {
		t.Fatalf("err %v, stdout %q", err, out)
	}
	got, err := os.ReadFile(path)
	if err != nil || !strings.Contains(string(got), `job "bert-finetune"`) {
		t.Errorf("%s: %v\n%s", path, err, got)
	}
	// A spec error leaves an existing output alone.
	bad := filepath.Join(t.TempDir(), "bad.hcl")
	os.WriteFile(bad, []byte("train \"x\" {\n  workers = 0\n}\n"), 0o644)
	if _, _, err := execute(t, bad, "-o", path); err == nil {
		t.Fatal("bad spec rendered")
	}
	if again, _ := os.ReadFile(path); string(again) != string(got) {
		t.Error("a failed render changed the output file")
	}
}

func TestRenderSpecErrors(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.hcl")
	os.WriteFile(bad, []byte("train \"x\" {\n  command = \"/bin/true\"\n  worker = 2\n  priority = 500\n}\n"), 0o644)
	out, errOut, err := execute(t, bad)
	if err == nil {
		t.Fatal("no error")
	}
	if out != "" {
		t.Errorf("rendered despite errors: %q", out)
	}
	if !strings.Contains(err.Error(), "2 errors") {
		t.Errorf("error %v", err)
	}
	for _, want := range []string{
		bad + `:3:3: error: Unsupported argument: An argument named "worker" is not expected here.`,
		"    3 |   worker = 2\n      |   ^^^^^^\n",
		bad + ":4:14: error: Invalid priority",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
}

func TestRenderBadVar(t *testing.T) {
	_, errOut, err := execute(t, "--var", "nope=1", example)
	if err == nil || !strings.Contains(errOut, "<-var nope=1>:1:1: error: Undeclared variable") {
		t.Errorf("err %v, stderr:\n%s", err, errOut)
	}
}

func TestRenderArgs(t *testing.T) {
	if _, _, err := execute(t); err == nil {
		t.Error("no SPEC accepted")
	}
	if _, _, err := execute(t, "a.hcl", "b.hcl"); err == nil {
		t.Error("two SPECs accepted")
	}
	_, errOut, err := execute(t, filepath.Join(t.TempDir(), "missing.hcl"))
	if err == nil || !strings.Contains(errOut, "missing.hcl") {
		t.Errorf("missing file: err %v, stderr %q", err, errOut)
	}
}

func TestRenderHelp(t *testing.T) {
	out, _, err := execute(t, "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"render SPEC", "Examples:", "gpujob render jobspecs/examples/bert-finetune.hcl", "--var", "--var-file", "-o, --output", "--checkpoint-root", "GPUJOB_CHECKPOINT_ROOT"} {
		if !strings.Contains(out, want) {
			t.Errorf("help lacks %q:\n%s", want, out)
		}
	}
}
