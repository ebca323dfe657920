package render_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpujob/gpujob/cli/command/render"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/iostreams"
)

// BenchmarkRenderCommand: a whole `gpujob render SPEC` (read the file,
// parse, render, write) inside the process, per example spec.
func BenchmarkRenderCommand(b *testing.B) {
	paths, _ := filepath.Glob("../../../jobspecs/examples/*.hcl")
	for _, p := range paths {
		// Train specs only: sweep-* and serve-* are other kinds.
		if base := filepath.Base(p); strings.HasSuffix(p, ".nomad.hcl") || strings.HasPrefix(base, "sweep-") || strings.HasPrefix(base, "serve-") {
			continue
		}
		b.Run(filepath.Base(p), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				io, _, out, _ := iostreams.Test()
				cmd := render.NewCmd(&factory.Factory{IO: io})
				cmd.SetArgs([]string{p})
				if err := cmd.Execute(); err != nil || out.Len() == 0 {
					b.Fatal(err)
				}
			}
		})
	}
}
