package sweep

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/spec"
)

var update = flag.Bool("update", false, "rewrite the golden files in jobspecs/rendered")

// TestGolden renders every example sweep into its controller's and first
// trial's jobspecs, which cli/render's TestNomadJobValidate has a real
// Nomad agent validate.
func TestGolden(t *testing.T) {
	specs, err := filepath.Glob("../../../jobspecs/examples/sweep-*.hcl")
	if err != nil || len(specs) == 0 {
		t.Fatalf("no example sweeps: %v", err)
	}
	for _, p := range specs {
		t.Run(filepath.Base(p), func(t *testing.T) {
			sw, files, diags := spec.LoadSweep(p, spec.Options{})
			if diags.HasErrors() {
				t.Fatal(spec.Format(diags, files))
			}
			ctl, trial, _, err := renderJobs(sw, render.Options{}, "default", "/usr/local/bin/gpujob")
			if err != nil {
				t.Fatal(err)
			}
			base := strings.TrimSuffix(filepath.Base(p), ".hcl")
			for suffix, got := range map[string][]byte{".controller.nomad.hcl": ctl, ".trial-001.nomad.hcl": trial} {
				golden := filepath.Join("../../../jobspecs/rendered", base+suffix)
				if *update {
					if err := os.WriteFile(golden, got, 0o644); err != nil {
						t.Fatal(err)
					}
					continue
				}
				want, err := os.ReadFile(golden)
				if err != nil {
					t.Fatalf("%v (go test ./cli/command/sweep -run TestGolden -update)", err)
				}
				if string(want) != string(got) {
					t.Errorf("%s differs from the rendering (rerun with -update if intended):\n%s", golden, got)
				}
			}
			if !strings.Contains(string(trial), `trial = "trial-001"`) || !strings.Contains(string(trial), `sweep = "`+sw.Name+`"`) {
				t.Errorf("the trial's gpujob task is not marked as the sweep's trial:\n%s", trial)
			}
		})
	}
}
