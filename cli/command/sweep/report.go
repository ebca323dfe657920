package sweep

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/cmdutil"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/sweepjob"
	"github.com/gpujob/gpujob/cli/sweepplot"
)

// ReportOptions is what `sweep report`'s arguments and flags ask for.
type ReportOptions struct {
	// Name is the sweep (the argument).
	Name string
	// Output is the file to write; Format png, svg or pdf (default: the
	// file's extension).
	Output, Format string
	Width, Height  int
}

func newReportCmd(f *factory.Factory) *cobra.Command { return NewReportCmd(f, nil) }

// NewReportCmd is the command running runF instead when runF is not nil: a
// test checks the Options the arguments parse into without running.
func NewReportCmd(f *factory.Factory, runF func(context.Context, *ReportOptions) error) *cobra.Command {
	o := &ReportOptions{}
	cmd := &cobra.Command{
		Use:   "report SWEEP -o FILE",
		Short: "Draw every trial's learning curve, stopped trials marked, the best highlighted",
		Long: `Report draws the objective metric of every trial against its step, from
the metric lines the trials reported: the best trial thick and blue, trials
stopped early ending in a red X (the legend says by what), failed trials
dashed. The format follows the file's extension (png, svg or pdf) unless
--format says otherwise.`,
		Example: `  gpujob sweep report toy-lr -o sweep.png
  gpujob sweep report toy-lr -o sweep.svg --width 1600 --height 900`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.Output == "" {
				return fmt.Errorf("-o FILE is required (png, svg or pdf)")
			}
			if o.Format == "" {
				o.Format = strings.TrimPrefix(filepath.Ext(o.Output), ".")
			}
			o.Name = args[0]
			return cmdutil.Run(cmd.Context(), o, runF, func(ctx context.Context) error { return runReport(ctx, f, o) })
		},
	}
	cmd.Flags().StringVarP(&o.Output, "output", "o", "", "the `file` to write")
	cmd.Flags().StringVar(&o.Format, "format", "", "png, svg or pdf (default: the file's extension)")
	cmd.Flags().IntVar(&o.Width, "width", 0, "image width in pixels (default 1200)")
	cmd.Flags().IntVar(&o.Height, "height", 0, "image height in pixels (default 700)")
	return cmd
}

func runReport(ctx context.Context, f *factory.Factory, o *ReportOptions) error {
	e, err := newEnv(f, false)
	if err != nil {
		return err
	}
	curves, rec, err := e.curves(ctx, o.Name)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	po := sweepplot.Options{Title: "sweep " + rec.Sweep + ": " + string(rec.Mode) + " " + rec.Metric, Metric: rec.Metric,
		Width: o.Width, Height: o.Height, Format: o.Format}
	if err := sweepplot.Render(&buf, curves, po); err != nil {
		return fmt.Errorf("drawing sweep %s: %w", o.Name, err)
	}
	if err := os.WriteFile(o.Output, buf.Bytes(), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(f.IO.Out, "wrote %s: %d trial(s)\n", o.Output, len(curves))
	return nil
}

// curves reads every trial's points of the objective from its metrics
// record.
func (e *env) curves(ctx context.Context, name string) ([]sweepplot.Curve, *sweepjob.Record, error) {
	rec, st, _, err := e.load(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	curves, err := sweepjob.ReadCurves(ctx, e.consul, e.prefix, e.ns, name, rec, st)
	if err != nil {
		return nil, nil, err
	}
	return curves, rec, nil
}
