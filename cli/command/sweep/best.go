package sweep

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/cmdutil"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/spec"
)

// BestOptions is what `sweep best`'s arguments and flags ask for.
type BestOptions struct {
	// Name is the sweep (the argument).
	Name string
	JSON bool
	// AsTrain prints a train spec with the best parameters.
	AsTrain bool
}

func newBestCmd(f *factory.Factory) *cobra.Command { return NewBestCmd(f, nil) }

// NewBestCmd is the command running runF instead when runF is not nil: a
// test checks the Options the arguments parse into without running.
func NewBestCmd(f *factory.Factory, runF func(context.Context, *BestOptions) error) *cobra.Command {
	o := &BestOptions{}
	cmd := &cobra.Command{
		Use:   "best SWEEP",
		Short: "Show a sweep's best trial, or a train spec with its parameters",
		Long: `Best prints the best trial: the best completed one, else (while none has
completed) the best value any trial reported. --as-train prints a train spec
made of the sweep's train block with every param.NAME replaced by the best
trial's value, ready for gpujob submit.`,
		Example: `  gpujob sweep best toy-lr
  gpujob sweep best toy-lr --as-train > best.hcl && gpujob submit best.hcl`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Name = args[0]
			return cmdutil.Run(cmd.Context(), o, runF, func(ctx context.Context) error { return runBest(ctx, f, o) })
		},
	}
	cmd.Flags().BoolVar(&o.JSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&o.AsTrain, "as-train", false, "print a train spec with the best parameters")
	return cmd
}

func runBest(ctx context.Context, f *factory.Factory, o *BestOptions) error {
	e, err := newEnv(f, false)
	if err != nil {
		return err
	}
	rec, st, _, err := e.load(ctx, o.Name)
	if err != nil {
		return err
	}
	b := st.Best(rec.Maximize())
	if b == nil {
		return fmt.Errorf("sweep %s has no trial with a value of %s yet", o.Name, rec.Metric)
	}
	switch {
	case o.AsTrain:
		src, err := spec.BestTrain([]byte(rec.Source), rec.SpecFile, o.Name+"-best", b.Params)
		if err != nil {
			return fmt.Errorf("sweep %s: writing the best trial's train spec: %w", o.Name, err)
		}
		fmt.Fprintf(f.IO.Out, "# The best trial of sweep %s: %s, %s %s.\n", o.Name, b.ID, rec.Metric, formatValue(b.Value))
		if len(rec.Vars)+len(rec.VarFiles) > 0 {
			fmt.Fprintf(f.IO.Out, "# The sweep was submitted with these variables; submit this spec with them too:\n#  ")
			for _, v := range rec.Vars {
				fmt.Fprintf(f.IO.Out, " -var %s", shellQuote(v))
			}
			for _, v := range rec.VarFiles {
				fmt.Fprintf(f.IO.Out, " -var-file %s", shellQuote(v))
			}
			fmt.Fprintln(f.IO.Out)
		}
		fmt.Fprintf(f.IO.Out, "%s", src)
		return nil
	case o.JSON:
		return gpujobs.PrintJSON(f.IO.Out, Trial{ID: b.ID, Job: b.JobID, State: string(b.State), Params: b.Params,
			Step: b.Step, Value: b.Value, StoppedBy: b.StoppedBy, Reason: b.Reason})
	}
	fmt.Fprintf(f.IO.Out, "%s: %s %s at step %d (%s)\nparams: %s\n", b.ID, rec.Metric, formatValue(b.Value), b.Step, b.State, b.Params)
	return nil
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'"'"'`) + "'" }
