package render_test

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/spec"
)

var update = flag.Bool("update", false, "rewrite the golden files in jobspecs/rendered")

const (
	examplesDir = "../../jobspecs/examples"
	renderedDir = "../../jobspecs/rendered"
)

// examples are the spec files in jobspecs/examples (*.hcl, not the
// hand-written *.nomad.hcl jobspecs that live there too).
func examples(t testing.TB) []string {
	t.Helper()
	all, err := filepath.Glob(filepath.Join(examplesDir, "*.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range all {
		// sweep-*.hcl are sweep specs: cli/command/sweep renders them;
		// serve-*.hcl are service specs (serviceExamples).
		if !strings.HasSuffix(p, ".nomad.hcl") && !strings.HasPrefix(filepath.Base(p), "sweep-") && !strings.HasPrefix(filepath.Base(p), "serve-") {
			out = append(out, p)
		}
	}
	if len(out) < 3 {
		t.Fatalf("want at least 3 example specs in %s, found %v", examplesDir, out)
	}
	return out
}

func goldenPath(specPath string) string {
	return filepath.Join(renderedDir, strings.TrimSuffix(filepath.Base(specPath), ".hcl")+".nomad.hcl")
}

func renderFile(t testing.TB, path string) []byte {
	t.Helper()
	tr, files, diags := spec.Load(path, spec.Options{})
	if diags.HasErrors() {
		t.Fatalf("%s:\n%s", path, spec.Format(diags, files))
	}
	out, err := render.Jobspec(tr)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestGolden(t *testing.T) {
	seen := map[string]bool{}
	for _, p := range examples(t) {
		t.Run(filepath.Base(p), func(t *testing.T) {
			got := renderFile(t, p)
			golden := goldenPath(p)
			seen[filepath.Base(golden)] = true
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./cli/render -run TestGolden -update)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("render %s differs from %s (rerun with -update if intended):\n%s", p, golden, diff(string(want), string(got)))
			}
			// Deterministic: a second render gives the same bytes.
			if again := renderFile(t, p); !bytes.Equal(got, again) {
				t.Errorf("render %s is not deterministic", p)
			}
		})
	}
	// No stale golden files.
	rendered, _ := filepath.Glob(filepath.Join(renderedDir, "*.nomad.hcl"))
	for _, r := range rendered {
		// sweep-* are cli/command/sweep's (its TestGolden checks them).
		if !seen[filepath.Base(r)] && !strings.HasPrefix(filepath.Base(r), "sweep-") && !strings.HasPrefix(filepath.Base(r), "serve-") {
			t.Errorf("%s has no spec in %s: remove it", r, examplesDir)
		}
	}
}

// diff is a line diff good enough for a test failure.
func diff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for i := 0; i < max(len(w), len(g)); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			b.WriteString("line " + itoa(i+1) + ":\n  want: " + wl + "\n  got:  " + gl + "\n")
		}
	}
	return b.String()
}

func itoa(i int) string {
	return strings.TrimSpace(strings.Repeat(" ", 0) + fmtInt(i))
}

func fmtInt(i int) string {
	if i == 0 {
		return "0"
	}
	var d []byte
	for ; i > 0; i /= 10 {
		d = append([]byte{byte('0' + i%10)}, d...)
	}
	return string(d)
}
