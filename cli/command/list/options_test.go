package list

import (
	"testing"

	"github.com/gpujob/gpujob/cli/cmdutil/cmdtest"
)

// The arguments parse into Options (through the runF seam: nothing runs).
func TestOptionsFromArgs(t *testing.T) {
	cmdtest.CheckOptions(t, NewCmdWith, []cmdtest.Case[Options]{
		{Args: []string{}, Want: Options{}},
		{Args: []string{"--json"}, Want: Options{JSON: true}},
	}, []string{"extra"})
}
