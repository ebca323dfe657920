package submit

import (
	"testing"

	"github.com/gpujob/gpujob/cli/cmdutil/cmdtest"
)

// The arguments parse into Options (through the runF seam: nothing runs).
func TestOptionsFromArgs(t *testing.T) {
	cmdtest.CheckOptions(t, NewCmdWith, []cmdtest.Case[Options]{
		{Args: []string{"spec.hcl"}, Want: Options{Path: "spec.hcl"}},
		{Args: []string{"--no-queue", "--detach", "--logs", "--var-file", "v.hcl", "spec.hcl"}, Want: Options{Path: "spec.hcl", NoQueue: true, Detach: true, Logs: true, VarFiles: []string{"v.hcl"}}},
	}, []string{})
}
