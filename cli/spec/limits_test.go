package spec_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/driver/rendezvous"
)

// TestHugeNumbersAreRefusedQuickly: a number HCL would take minutes to turn
// into text (FuzzParse hung on workers = 1e10000000) is refused at once,
// at its place, wherever it is written.
func TestHugeNumbersAreRefusedQuickly(t *testing.T) {
	const huge = "1e10000000"
	varFile := filepath.Join(t.TempDir(), "vars.hcl")
	if err := os.WriteFile(varFile, []byte("n = "+huge+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	jsonVarFile := filepath.Join(t.TempDir(), "vars.json")
	if err := os.WriteFile(jsonVarFile, []byte(`{"n": `+huge+`}`), 0o644); err != nil {
		t.Fatal(err)
	}
	withVar := "variable \"n\" {\n  type = number\n  default = 1\n}\ntrain \"x\" {\n  command = \"a\"\n  workers = var.n\n}\n"
	for _, c := range []struct {
		name, file, src string
		o               spec.Options
		want            string
	}{
		{"workers", "spec.hcl", "train \"x\" {\n  command = \"a\"\n  workers = " + huge + "\n}\n", spec.Options{}, "spec.hcl:3:13: error: Number out of range"},
		{"tiny", "spec.hcl", "train \"x\" {\n  command = \"a\"\n  workers = 1e-10000000\n}\n", spec.Options{}, "spec.hcl:3:13: error: Number out of range"},
		{"string from a number", "spec.hcl", "train \"x\" {\n  command = " + huge + "\n}\n", spec.Options{}, "spec.hcl:2:13: error: Number out of range"},
		{"template", "spec.hcl", "train \"x\" {\n  command = \"/bin/${" + huge + "}\"\n}\n", spec.Options{}, "spec.hcl:2:21: error: Number out of range"},
		{"default", "spec.hcl", strings.Replace(withVar, "default = 1", "default = "+huge, 1), spec.Options{}, "spec.hcl:3:13: error: Number out of range"},
		{"-var", "spec.hcl", withVar, spec.Options{Vars: []string{"n=" + huge}}, "<-var n=" + huge + ">:1:3: error: Number out of range"},
		{"-var-file", "spec.hcl", withVar, spec.Options{VarFiles: []string{varFile}}, varFile + ":1:5: error: Number out of range"},
		{"JSON -var-file", "spec.hcl", withVar, spec.Options{VarFiles: []string{jsonVarFile}}, jsonVarFile + ":1:"},
		{"JSON number", "spec.json", `{"train": {"x": {"command": "a", "workers": ` + huge + `}}}`, spec.Options{}, "spec.json:1:"},
		{"JSON template", "spec.json", `{"train": {"x": {"command": "${` + huge + `}"}}}`, spec.Options{}, "spec.json:1:"},
	} {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			tr, files, diags := spec.LoadSource([]byte(c.src), c.file, c.o)
			out := spec.Format(diags, files)
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("took %s", took)
			}
			if tr != nil || !strings.Contains(out, c.want) || !strings.Contains(out, "Number out of range") {
				t.Errorf("diagnostics lack %q:\n%s", c.want, out)
			}
		})
	}
	// Within range, a large number is only too large for its field.
	_, files, diags := spec.LoadSource([]byte("train \"x\" {\n  command = \"a\"\n  workers = 1e300\n}\n"), "spec.hcl", spec.Options{})
	if out := spec.Format(diags, files); !strings.Contains(out, `Attribute "workers": 1e+300 is too large`) {
		t.Errorf("1e300:\n%s", out)
	}
}

// TestMaxWorkersIsTheDriversLimit: validate refuses what the driver would.
func TestMaxWorkersIsTheDriversLimit(t *testing.T) {
	if spec.MaxWorkers != rendezvous.MaxMembers {
		t.Errorf("spec.MaxWorkers %d, rendezvous.MaxMembers %d", spec.MaxWorkers, rendezvous.MaxMembers)
	}
	src := func(n string) string { return "train \"x\" {\n  command = \"a\"\n  workers = " + n + "\n}\n" }
	if tr, _, diags := spec.LoadSource([]byte(src("10000")), "spec.hcl", spec.Options{}); diags.HasErrors() || tr.Workers != 10000 {
		t.Errorf("10000 workers refused: %v", diags)
	}
	_, files, diags := spec.LoadSource([]byte(src("10001")), "spec.hcl", spec.Options{})
	if out := spec.Format(diags, files); !strings.Contains(out, "spec.hcl:3:13: error: Invalid workers: workers must be at most 10000") {
		t.Errorf("10001 workers:\n%s", out)
	}
}
