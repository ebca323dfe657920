package service

import (
	"testing"

	"github.com/gpujob/gpujob/cli/cmdutil/cmdtest"
)

// Each verb's arguments parse into its Options (through the runF seam:
// nothing runs), and bad ones are refused with the error users see.

func TestDeployOptionsFromArgs(t *testing.T) {
	cmdtest.CheckOptions(t, NewDeployCmd, []cmdtest.Case[DeployOptions]{
		{Args: []string{"serve.hcl"}, Want: DeployOptions{Path: "serve.hcl"}},
		{Args: []string{"--var", "version=v2", "--var-file", "v.hcl", "--detach", "--json", "--gateway", "http://gw:8080", "serve.hcl"},
			Want: DeployOptions{Path: "serve.hcl", Vars: []string{"version=v2"}, VarFiles: []string{"v.hcl"}, Detach: true, JSON: true, Gateway: "http://gw:8080"}},
		{Args: []string{"--queue", "serving", "serve.hcl"}, Want: DeployOptions{Path: "serve.hcl", Queue: "serving"}},
	}, []string{})
	cmdtest.CheckRefusals(t, NewDeployCmd, cmdtest.Refusal{Args: []string{"--queue", "a/b", "serve.hcl"}, Err: `--queue: "a/b" is not a queue name`})
}

func TestRenderOptionsFromArgs(t *testing.T) {
	cmdtest.CheckOptions(t, NewRenderCmd, []cmdtest.Case[RenderOptions]{
		{Args: []string{"serve.hcl"}, Want: RenderOptions{Path: "serve.hcl"}},
		{Args: []string{"--route", "--var", "version=v2", "--var-file", "v.hcl", "serve.hcl"},
			Want: RenderOptions{Path: "serve.hcl", Route: true, Vars: []string{"version=v2"}, VarFiles: []string{"v.hcl"}}},
	})
	cmdtest.CheckRefusals(t, NewRenderCmd,
		cmdtest.Refusal{Args: []string{}, Err: "accepts 1 arg(s), received 0"},
		cmdtest.Refusal{Args: []string{"a.hcl", "b.hcl"}, Err: "accepts 1 arg(s), received 2"})
}

func TestStatusOptionsFromArgs(t *testing.T) {
	cmdtest.CheckOptions(t, NewStatusCmd, []cmdtest.Case[StatusOptions]{
		{Args: []string{"bert"}, Want: StatusOptions{Name: "bert"}},
		{Args: []string{"--json", "--gateway", "http://gw:8080", "--gateway-admin", "http://gw:8081", "bert"},
			Want: StatusOptions{Name: "bert", JSON: true, Gateway: "http://gw:8080", GatewayAdmin: "http://gw:8081"}},
	})
	cmdtest.CheckRefusals(t, NewStatusCmd, cmdtest.Refusal{Args: []string{}, Err: "accepts 1 arg(s), received 0"})
}

func TestScaleOptionsFromArgs(t *testing.T) {
	cmdtest.CheckOptions(t, NewScaleCmd, []cmdtest.Case[ScaleOptions]{
		{Args: []string{"bert", "3"}, Want: ScaleOptions{Name: "bert", Count: 3}},
		{Args: []string{"bert", "0"}, Want: ScaleOptions{Name: "bert", Count: 0}},
	})
	cmdtest.CheckRefusals(t, NewScaleCmd,
		cmdtest.Refusal{Args: []string{"bert"}, Err: "accepts 2 arg(s), received 1"},
		cmdtest.Refusal{Args: []string{"bert", "many"}, Err: `COUNT must be a whole number of replicas, 0 or more, not "many"`},
		cmdtest.Refusal{Args: []string{"bert", "--", "-1"}, Err: `0 or more, not "-1"`},
		cmdtest.Refusal{Args: []string{"bert", "1.5"}, Err: `not "1.5"`})
}

func TestRollbackOptionsFromArgs(t *testing.T) {
	cmdtest.CheckOptions(t, NewRollbackCmd, []cmdtest.Case[RollbackOptions]{
		{Args: []string{"bert"}, Want: RollbackOptions{Name: "bert", ToVersion: -1}},
		{Args: []string{"--to-version", "3", "--detach", "bert"}, Want: RollbackOptions{Name: "bert", ToVersion: 3, Detach: true}},
	})
	cmdtest.CheckRefusals(t, NewRollbackCmd,
		cmdtest.Refusal{Args: []string{"--to-version", "latest", "bert"}, Err: `invalid argument "latest" for "--to-version"`},
		cmdtest.Refusal{Args: []string{"a", "b"}, Err: "accepts 1 arg(s), received 2"})
}

func TestLogsOptionsFromArgs(t *testing.T) {
	cmdtest.CheckOptions(t, NewLogsCmd, []cmdtest.Case[LogsOptions]{
		{Args: []string{"bert"}, Want: LogsOptions{Name: "bert"}},
		{Args: []string{"-f", "--stderr", "--alloc", "3f2a", "bert"}, Want: LogsOptions{Name: "bert", Follow: true, Stderr: true, Alloc: "3f2a"}},
	})
	cmdtest.CheckRefusals(t, NewLogsCmd, cmdtest.Refusal{Args: []string{}, Err: "accepts 1 arg(s), received 0"})
}

func TestStopOptionsFromArgs(t *testing.T) {
	cmdtest.CheckOptions(t, NewStopCmd, []cmdtest.Case[StopOptions]{
		{Args: []string{"bert"}, Want: StopOptions{Name: "bert"}},
		{Args: []string{"--purge", "bert"}, Want: StopOptions{Name: "bert", Purge: true}},
	})
	cmdtest.CheckRefusals(t, NewStopCmd, cmdtest.Refusal{Args: []string{"a", "b"}, Err: "accepts 1 arg(s), received 2"})
}
