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
		{Args: []string{"--queue", "team-a", "spec.hcl"}, Want: Options{Path: "spec.hcl", Queue: "team-a"}},
	}, []string{})
	cmdtest.CheckRefusals(t, NewCmdWith,
		cmdtest.Refusal{Args: []string{"--queue", "team a", "spec.hcl"}, Err: `--queue: "team a" is not a queue name`},
		cmdtest.Refusal{Args: []string{"--queue", "../x", "spec.hcl"}, Err: "is not a queue name"})
}
