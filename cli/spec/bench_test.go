package spec_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpujob/gpujob/cli/spec"
)

// BenchmarkParse: one spec parse (what gpujob validate and render do before
// anything else) per example spec.
func BenchmarkParse(b *testing.B) {
	paths, _ := filepath.Glob("../../jobspecs/examples/*.hcl")
	for _, p := range paths {
		// Train specs only: sweep-* and serve-* are other kinds.
		if base := filepath.Base(p); strings.HasSuffix(p, ".nomad.hcl") || strings.HasPrefix(base, "sweep-") || strings.HasPrefix(base, "serve-") {
			continue
		}
		src, err := os.ReadFile(p)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(filepath.Base(p), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, diags := spec.Parse(src, p, spec.Options{}); diags.HasErrors() {
					b.Fatal(diags)
				}
			}
		})
	}
}
