package service

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/cmdutil"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/servicedeploy"
)

// LogsOptions is what `service logs`' arguments and flags ask for.
type LogsOptions struct {
	// Name is the service (the argument).
	Name   string
	Follow bool
	Stderr bool
	// Alloc picks one replica by its allocation ID or a prefix of it.
	Alloc string
}

func newLogsCmd(f *factory.Factory) *cobra.Command { return NewLogsCmd(f, nil) }

// NewLogsCmd is the command running runF instead when runF is not nil: a
// test checks the Options the arguments parse into without running.
func NewLogsCmd(f *factory.Factory, runF func(context.Context, *LogsOptions) error) *cobra.Command {
	o := &LogsOptions{}
	cmd := &cobra.Command{
		Use:   "logs NAME",
		Short: "Show the logs of a service's running replicas, each line prefixed with its replica",
		Long: `Logs prints the stdout (or, with --stderr, the stderr) of every running
replica of the service, each line prefixed "[<alloc name> <version>] ".
--alloc picks one replica by its allocation ID (a prefix will do). --follow
streams them all at once until Ctrl-C.`,
		Example: `  gpujob service logs bert-clf
  gpujob service logs bert-clf --stderr -f
  gpujob service logs bert-clf --alloc 3f2a`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Name = args[0]
			return cmdutil.Run(cmd.Context(), o, runF, func(ctx context.Context) error { return runLogs(ctx, f, o) })
		},
	}
	cmd.Flags().BoolVarP(&o.Follow, "follow", "f", false, "keep streaming new lines")
	cmd.Flags().BoolVar(&o.Stderr, "stderr", false, "show stderr instead of stdout")
	cmd.Flags().StringVar(&o.Alloc, "alloc", "", "only the replica with this allocation `ID` (or prefix)")
	return cmd
}

func runLogs(ctx context.Context, f *factory.Factory, o *LogsOptions) error {
	nomad, err := f.Nomad()
	if err != nil {
		return err
	}
	stream := "stdout"
	if o.Stderr {
		stream = "stderr"
	}
	return servicedeploy.Logs(ctx, nomad, f.IO.Out, servicedeploy.LogsRequest{Name: o.Name, AllocPrefix: o.Alloc,
		Stream: stream, Follow: o.Follow})
}
