package service

import (
	"testing"

	"github.com/gpujob/gpujob/cli/cmdutil/cmdtest"
)

// `service deploy`'s arguments parse into DeployOptions (through the runF
// seam: nothing runs).
func TestDeployOptionsFromArgs(t *testing.T) {
	cmdtest.CheckOptions(t, NewDeployCmd, []cmdtest.Case[DeployOptions]{
		{Args: []string{"serve.hcl"}, Want: DeployOptions{Path: "serve.hcl"}},
		{Args: []string{"--var", "version=v2", "--var-file", "v.hcl", "--detach", "--json", "--gateway", "http://gw:8080", "serve.hcl"},
			Want: DeployOptions{Path: "serve.hcl", Vars: []string{"version=v2"}, VarFiles: []string{"v.hcl"}, Detach: true, JSON: true, Gateway: "http://gw:8080"}},
	}, []string{})
}
