package sweep

import (
	"testing"

	"github.com/gpujob/gpujob/cli/cmdutil/cmdtest"
	"github.com/gpujob/gpujob/cli/sweepjob"
)

// Each verb's arguments parse into its Options (through the runF seam:
// nothing runs), and bad ones are refused with the error users see.

func TestSubmitOptionsFromArgs(t *testing.T) {
	cmdtest.CheckOptions(t, NewSubmitCmd, []cmdtest.Case[SubmitOptions]{
		{Args: []string{"sweep.hcl"}, Want: SubmitOptions{Path: "sweep.hcl"}},
		{Args: []string{"--var", "a=b", "--checkpoint-root", "/ckpt", "--controller-binary", "/usr/bin/gpujob", "--controller-user", "ctl",
			"--detach", "--json", "sweep.hcl"},
			Want: SubmitOptions{Path: "sweep.hcl", Vars: []string{"a=b"}, CheckpointRoot: "/ckpt", ControllerBinary: "/usr/bin/gpujob",
				ControllerUser: "ctl", Detach: true, JSON: true}},
	}, []string{"a.hcl", "b.hcl"})
}

func TestStatusOptionsFromArgs(t *testing.T) {
	cmdtest.CheckOptions(t, NewStatusCmd, []cmdtest.Case[StatusOptions]{
		{Args: []string{"lr"}, Want: StatusOptions{Name: "lr"}},
		{Args: []string{"--json", "lr"}, Want: StatusOptions{Name: "lr", JSON: true}},
	})
	cmdtest.CheckRefusals(t, NewStatusCmd, cmdtest.Refusal{Args: []string{}, Err: "accepts 1 arg(s), received 0"})
}

func TestBestOptionsFromArgs(t *testing.T) {
	cmdtest.CheckOptions(t, NewBestCmd, []cmdtest.Case[BestOptions]{
		{Args: []string{"lr"}, Want: BestOptions{Name: "lr"}},
		{Args: []string{"--json", "lr"}, Want: BestOptions{Name: "lr", JSON: true}},
		{Args: []string{"--as-train", "lr"}, Want: BestOptions{Name: "lr", AsTrain: true}},
	})
	cmdtest.CheckRefusals(t, NewBestCmd, cmdtest.Refusal{Args: []string{"a", "b"}, Err: "accepts 1 arg(s), received 2"})
}

func TestReportOptionsFromArgs(t *testing.T) {
	cmdtest.CheckOptions(t, NewReportCmd, []cmdtest.Case[ReportOptions]{
		{Args: []string{"lr", "-o", "sweep.png"}, Want: ReportOptions{Name: "lr", Output: "sweep.png", Format: "png"}},
		{Args: []string{"lr", "--output", "out.img", "--format", "svg", "--width", "1600", "--height", "900"},
			Want: ReportOptions{Name: "lr", Output: "out.img", Format: "svg", Width: 1600, Height: 900}},
	})
	cmdtest.CheckRefusals(t, NewReportCmd,
		cmdtest.Refusal{Args: []string{"lr"}, Err: "-o FILE is required (png, svg or pdf)"},
		cmdtest.Refusal{Args: []string{"lr", "-o", "x.png", "--width", "wide"}, Err: `invalid argument "wide" for "--width"`},
		cmdtest.Refusal{Args: []string{"-o", "x.png"}, Err: "accepts 1 arg(s), received 0"})
}

func TestStopOptionsFromArgs(t *testing.T) {
	cmdtest.CheckOptions(t, NewStopCmd, []cmdtest.Case[StopOptions]{
		{Args: []string{"lr"}, Want: StopOptions{Name: "lr"}},
		{Args: []string{"--purge", "lr"}, Want: StopOptions{Name: "lr", Purge: true}},
	})
	cmdtest.CheckRefusals(t, NewStopCmd, cmdtest.Refusal{Args: []string{}, Err: "accepts 1 arg(s), received 0"})
}

func TestExtendOptionsFromArgs(t *testing.T) {
	cmdtest.CheckOptions(t, NewExtendCmd, []cmdtest.Case[ExtendOptions]{
		{Args: []string{"lr", "--max-trials", "+4"}, Want: ExtendOptions{Name: "lr", MaxTrials: sweepjob.MaxTrials{N: 4, Add: true}}},
		{Args: []string{"lr", "--max-trials", "12", "--controller-binary", "/opt/gpujob", "--controller-user", "ctl", "--detach"},
			Want: ExtendOptions{Name: "lr", MaxTrials: sweepjob.MaxTrials{N: 12}, ControllerBinary: "/opt/gpujob", ControllerUser: "ctl", Detach: true}},
	})
	cmdtest.CheckRefusals(t, NewExtendCmd,
		cmdtest.Refusal{Args: []string{"lr"}, Err: `required flag(s) "max-trials" not set`},
		cmdtest.Refusal{Args: []string{"lr", "--max-trials", "more"}, Err: `--max-trials "more": want +N or N`},
		cmdtest.Refusal{Args: []string{"lr", "--max-trials", "-1"}, Err: `--max-trials "-1": want +N or N`})
}

func TestRenderOptionsFromArgs(t *testing.T) {
	cmdtest.CheckOptions(t, NewRenderCmd, []cmdtest.Case[RenderOptions]{
		{Args: []string{"sweep.hcl"}, Want: RenderOptions{Path: "sweep.hcl"}},
		{Args: []string{"--var", "a=b", "--var-file", "v.hcl", "--checkpoint-root", "/ckpt", "--controller-binary", "/opt/gpujob", "sweep.hcl"},
			Want: RenderOptions{Path: "sweep.hcl", Vars: []string{"a=b"}, VarFiles: []string{"v.hcl"}, CheckpointRoot: "/ckpt",
				ControllerBinary: "/opt/gpujob"}},
	})
	cmdtest.CheckRefusals(t, NewRenderCmd, cmdtest.Refusal{Args: []string{}, Err: "accepts 1 arg(s), received 0"})
}

func TestControllerOptionsFromArgs(t *testing.T) {
	cmdtest.CheckOptions(t, NewControllerCmd, []cmdtest.Case[ControllerOptions]{
		{Args: []string{"lr"}, Want: ControllerOptions{Name: "lr"}},
	})
	cmdtest.CheckRefusals(t, NewControllerCmd, cmdtest.Refusal{Args: []string{"a", "b"}, Err: "accepts 1 arg(s), received 2"})
}
