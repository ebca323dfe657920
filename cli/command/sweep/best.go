package sweep

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/spec"
)

func newBestCmd(f *factory.Factory) *cobra.Command {
	var asJSON, asTrain bool
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
			e, err := newEnv(f, false)
			if err != nil {
				return err
			}
			rec, st, _, err := e.load(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			b := st.Best(rec.Maximize())
			if b == nil {
				return fmt.Errorf("sweep %s has no trial with a value of %s yet", args[0], rec.Metric)
			}
			switch {
			case asTrain:
				src, err := spec.BestTrain([]byte(rec.Source), rec.SpecFile, args[0]+"-best", b.Params)
				if err != nil {
					return err
				}
				fmt.Fprintf(f.IO.Out, "# The best trial of sweep %s: %s, %s %s.\n", args[0], b.ID, rec.Metric, formatValue(b.Value))
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
			case asJSON:
				return gpujobs.PrintJSON(f.IO.Out, Trial{ID: b.ID, Job: b.JobID, State: string(b.State), Params: b.Params,
					Step: b.Step, Value: b.Value, StoppedBy: b.StoppedBy, Reason: b.Reason})
			}
			fmt.Fprintf(f.IO.Out, "%s: %s %s at step %d (%s)\nparams: %s\n", b.ID, rec.Metric, formatValue(b.Value), b.Step, b.State, b.Params)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&asTrain, "as-train", false, "print a train spec with the best parameters")
	return cmd
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'"'"'`) + "'" }
