package sweep

import (
	"testing"

	"github.com/gpujob/gpujob/cli/cmdutil/cmdtest"
)

// `sweep submit`'s arguments parse into SubmitOptions (through the runF
// seam: nothing runs).
func TestSubmitOptionsFromArgs(t *testing.T) {
	cmdtest.CheckOptions(t, NewSubmitCmd, []cmdtest.Case[SubmitOptions]{
		{Args: []string{"sweep.hcl"}, Want: SubmitOptions{Path: "sweep.hcl"}},
		{Args: []string{"--var", "a=b", "--checkpoint-root", "/ckpt", "--controller-binary", "/usr/bin/gpujob", "--controller-user", "ctl",
			"--detach", "--json", "sweep.hcl"},
			Want: SubmitOptions{Path: "sweep.hcl", Vars: []string{"a=b"}, CheckpointRoot: "/ckpt", ControllerBinary: "/usr/bin/gpujob",
				ControllerUser: "ctl", Detach: true, JSON: true}},
	}, []string{"a.hcl", "b.hcl"})
}
