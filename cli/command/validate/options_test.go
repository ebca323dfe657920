package validate

import (
	"testing"

	"github.com/gpujob/gpujob/cli/cmdutil/cmdtest"
)

// The arguments parse into Options (through the runF seam: nothing runs).
func TestOptionsFromArgs(t *testing.T) {
	cmdtest.CheckOptions(t, NewCmdWith, []cmdtest.Case[Options]{
		{Args: []string{"spec.hcl"}, Want: Options{Path: "spec.hcl"}},
		{Args: []string{"--var", "workers=2", "--var", "x=y", "--var-file", "a.hcl", "--checkpoint-root", "/ckpt", "spec.hcl"}, Want: Options{Path: "spec.hcl", Vars: []string{"workers=2", "x=y"}, VarFiles: []string{"a.hcl"}, CheckpointRoot: "/ckpt"}},
	}, []string{})
}
