package render

import (
	"testing"

	"github.com/gpujob/gpujob/cli/cmdutil/cmdtest"
)

// The arguments parse into Options (through the runF seam: nothing runs).
func TestOptionsFromArgs(t *testing.T) {
	cmdtest.CheckOptions(t, NewCmdWith, []cmdtest.Case[Options]{
		{Args: []string{"spec.hcl"}, Want: Options{Path: "spec.hcl"}},
		{Args: []string{"-o", "job.nomad.hcl", "--var", "workers=2", "spec.hcl"}, Want: Options{Path: "spec.hcl", Output: "job.nomad.hcl", Vars: []string{"workers=2"}}},
	}, []string{})
}
