package render_test

import (
	"path/filepath"
	"testing"

	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/spec"
)

// BenchmarkRender: one jobspec render (hclwrite) per example spec.
func BenchmarkRender(b *testing.B) {
	for _, p := range examples(b) {
		tr, diags := spec.ParseFile(p, spec.Options{})
		if diags.HasErrors() {
			b.Fatal(diags)
		}
		b.Run(filepath.Base(p), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := render.Jobspec(tr); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
