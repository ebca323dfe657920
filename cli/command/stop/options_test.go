package stop

import (
	"testing"

	"github.com/gpujob/gpujob/cli/cmdutil/cmdtest"
)

// The arguments parse into Options (through the runF seam: nothing runs).
func TestOptionsFromArgs(t *testing.T) {
	cmdtest.CheckOptions(t, NewCmdWith, []cmdtest.Case[Options]{
		{Args: []string{"bert"}, Want: Options{Job: "bert"}},
		{Args: []string{"--purge", "--detach", "bert"}, Want: Options{Job: "bert", Purge: true, Detach: true}},
	}, []string{})
}
