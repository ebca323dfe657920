package logs

import (
	"testing"

	"github.com/gpujob/gpujob/cli/cmdutil/cmdtest"
)

// The arguments parse into Options (through the runF seam: nothing runs).
func TestOptionsFromArgs(t *testing.T) {
	cmdtest.CheckOptions(t, NewCmdWith, []cmdtest.Case[Options]{
		{Args: []string{"bert"}, Want: Options{Job: "bert", Rank: -1}},
		{Args: []string{"-f", "--rank", "0", "--stderr", "bert"}, Want: Options{Job: "bert", Rank: 0, Follow: true, Stderr: true}},
	}, []string{"--rank", "-1", "bert"})
}
