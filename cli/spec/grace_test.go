package spec_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gpujob/gpujob/cli/spec"
)

// checkpoint_grace is a duration between 1s and 10m, 30s when unset; a
// bad one is an error at its file:line.
func TestCheckpointGrace(t *testing.T) {
	for _, tc := range []struct {
		attr string
		want time.Duration
		err  string
	}{
		{"", spec.DefaultCheckpointGrace, ""},
		{`checkpoint_grace = "2m"`, 2 * time.Minute, ""},
		{`checkpoint_grace = "1s"`, time.Second, ""},
		{`checkpoint_grace = "10m"`, 10 * time.Minute, ""},
		{`checkpoint_grace = "11m"`, 0, `g.hcl:3,22-27: Invalid checkpoint_grace; checkpoint_grace must be between 1s and 10m`},
		{`checkpoint_grace = "500ms"`, 0, "g.hcl:3,22-29: Invalid checkpoint_grace"},
		{`checkpoint_grace = "soon"`, 0, `g.hcl:3,22-28: Invalid duration; checkpoint_grace "soon" is not a duration`},
	} {
		src := "train \"t\" {\n  command = \"/bin/true\"\n  " + tc.attr + "\n}\n"
		tr, diags := spec.Parse([]byte(src), "g.hcl", spec.Options{})
		if tc.err != "" {
			if !diags.HasErrors() || !strings.Contains(diags.Error(), tc.err) {
				t.Errorf("%s: %v, want %q", tc.attr, diags, tc.err)
			}
			continue
		}
		if diags.HasErrors() || tr.CheckpointGrace != tc.want {
			t.Errorf("%s: %v, grace %s, want %s", tc.attr, diags, tr.CheckpointGrace, tc.want)
		}
	}
}
