package validate_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpujob/gpujob/cli/command/validate"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/iostreams"
	"github.com/gpujob/gpujob/cli/nomadapi"
)

const examples = "../../../jobspecs/examples/"

func execute(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	io, _, out, errOut := iostreams.Test()
	f := &factory.Factory{IO: io, Nomad: func() (nomadapi.API, error) {
		t.Fatal("validate asked for the Nomad API: it must work offline")
		return nil, nil
	}}
	cmd := validate.NewCmd(f)
	cmd.SetArgs(args)
	cmd.SetOut(out)
	cmd.SetErr(errOut)
	err := cmd.Execute()
	return out.String(), errOut.String(), err
}

func TestValidateExamples(t *testing.T) {
	for file, want := range map[string]string{
		"bert-finetune.hcl": "ok (job bert-finetune, 2 workers × 1 GPU)",
		"cpu-smoke.hcl":     "ok (job cpu-smoke, 2 workers × 0 GPUs)",
		"bert-t4.hcl":       "ok (job bert-t4, 4 workers × 2 GPUs)",
		"bert-image.hcl":    "ok (job bert-image, 2 workers × 1 GPU)",
	} {
		out, errOut, err := execute(t, examples+file)
		if err != nil || errOut != "" {
			t.Errorf("%s: err %v, stderr %q", file, err, errOut)
		}
		if out != examples+file+": "+want+"\n" {
			t.Errorf("%s: got %q", file, out)
		}
	}
}

func TestValidateCheckpointRoot(t *testing.T) {
	t.Setenv("GPUJOB_CHECKPOINT_ROOT", "")
	if out, _, err := execute(t, "--checkpoint-root", "/srv/ckpt", examples+"bert-image.hcl"); err != nil || !strings.Contains(out, "ok") {
		t.Errorf("err %v, out %q", err, out)
	}
	if _, _, err := execute(t, "--checkpoint-root", "ckpt", examples+"bert-image.hcl"); err == nil || !strings.Contains(err.Error(), "--checkpoint-root") {
		t.Errorf("a relative --checkpoint-root: %v", err)
	}
}

func TestValidateVars(t *testing.T) {
	vf := filepath.Join(t.TempDir(), "v.hcl")
	os.WriteFile(vf, []byte("workers = 3\n"), 0o644)
	out, _, err := execute(t, "--var-file", vf, "--var", "gpus_per_worker=4", examples+"bert-finetune.hcl")
	if err != nil || !strings.Contains(out, "3 workers × 4 GPUs") {
		t.Errorf("err %v, out %q", err, out)
	}
	out, _, err = execute(t, "--var", "workers=1", examples+"bert-finetune.hcl")
	if err != nil || !strings.Contains(out, "1 worker × 1 GPU)") {
		t.Errorf("err %v, out %q", err, out)
	}
}

func TestValidateErrors(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.hcl")
	os.WriteFile(bad, []byte("train \"x\" {\n  workers = 0\n  gpu {\n    min_memory = \"16 Gb\"\n  }\n}\n"), 0o644)
	out, errOut, err := execute(t, bad)
	if err == nil || out != "" {
		t.Fatalf("err %v, out %q", err, out)
	}
	if err.Error() != bad+": 3 errors" {
		t.Errorf("error %q", err)
	}
	for _, want := range []string{
		bad + ":2:13: error: Invalid workers",
		bad + ":1:1: error: Missing required argument",
		bad + `:4:18: error: Invalid gpu.min_memory: unknown unit "Gb"`,
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
	_, errOut, err = execute(t, "--var", "workers=zero", examples+"bert-finetune.hcl")
	if err == nil || !strings.Contains(errOut, "<-var workers=zero>:1:9: error: Invalid value for variable") {
		t.Errorf("err %v, stderr:\n%s", err, errOut)
	}
}

func TestValidateRefusesUnsafeJobNames(t *testing.T) {
	for name, want := range map[string]string{
		"../../../../../tmp/escaped": "starts with '.'",
		"team/bert":                  "'/' (a path separator) at byte 4",
		"a%2Fb":                      "'%' at byte 1",
	} {
		spec := filepath.Join(t.TempDir(), "spec.hcl")
		os.WriteFile(spec, []byte("train \""+name+"\" {\n  command = \"/bin/true\"\n}\n"), 0o644)
		out, errOut, err := execute(t, spec)
		if err == nil || out != "" {
			t.Errorf("%q: err %v, out %q", name, err, out)
		}
		if !strings.Contains(errOut, spec+":1:7: error: Invalid job name") || !strings.Contains(errOut, want) {
			t.Errorf("%q: stderr lacks the position or %q:\n%s", name, want, errOut)
		}
	}
}

func TestValidateHelp(t *testing.T) {
	out, _, err := execute(t, "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"validate SPEC", "Examples:", "gpujob validate jobspecs/examples/bert-finetune.hcl", "--var-file"} {
		if !strings.Contains(out, want) {
			t.Errorf("help lacks %q:\n%s", want, out)
		}
	}
}
