package sweep

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	consul "github.com/hashicorp/consul/api"
	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/sweepjob"
	"github.com/gpujob/gpujob/cli/sweepplot"
	"github.com/gpujob/gpujob/internal/safename"
	"github.com/gpujob/gpujob/internal/sweep/controller"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

func newReportCmd(f *factory.Factory) *cobra.Command {
	var output, format string
	var width, height int
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
			if output == "" {
				return fmt.Errorf("-o FILE is required (png, svg or pdf)")
			}
			if format == "" {
				format = strings.TrimPrefix(filepath.Ext(output), ".")
			}
			e, err := newEnv(f, false)
			if err != nil {
				return err
			}
			curves, rec, err := e.curves(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			var buf bytes.Buffer
			o := sweepplot.Options{Title: "sweep " + rec.Sweep + ": " + string(rec.Mode) + " " + rec.Metric, Metric: rec.Metric,
				Width: width, Height: height, Format: format}
			if err := sweepplot.Render(&buf, curves, o); err != nil {
				return err
			}
			if err := os.WriteFile(output, buf.Bytes(), 0o644); err != nil {
				return err
			}
			fmt.Fprintf(f.IO.Out, "wrote %s: %d trial(s)\n", output, len(curves))
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "the `file` to write")
	cmd.Flags().StringVar(&format, "format", "", "png, svg or pdf (default: the file's extension)")
	cmd.Flags().IntVar(&width, "width", 0, "image width in pixels (default 1200)")
	cmd.Flags().IntVar(&height, "height", 0, "image height in pixels (default 700)")
	return cmd
}

// curves reads every trial's points of the objective from its metrics
// record.
func (e *env) curves(ctx context.Context, name string) ([]sweepplot.Curve, *sweepjob.Record, error) {
	rec, st, _, err := e.load(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	prefix := sweepkv.SweepKey(e.prefix, e.ns, name) + "/trials/"
	pairs, _, err := e.consul.KV().List(prefix, (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, nil, fmt.Errorf("reading %s: %w", prefix, err)
	}
	byKey := map[string][]byte{}
	for _, p := range pairs {
		byKey[p.Key] = p.Value
	}
	best := st.Best(rec.Maximize())
	var curves []sweepplot.Curve
	for _, t := range st.Trials {
		c := sweepplot.Curve{ID: t.ID, Label: t.ID + " " + t.Params.String(), State: string(t.State),
			Best: best != nil && best.ID == t.ID}
		if t.State == controller.TrialStopped {
			c.StopNote = stopNote(t)
		}
		if raw := byKey[prefix+safename.Encode(t.ID)+"/metrics"]; raw != nil {
			var m sweepkv.Metrics
			if err := json.Unmarshal(raw, &m); err != nil {
				return nil, nil, fmt.Errorf("reading the metrics of %s: %w", t.ID, err)
			}
			for _, p := range m.Points {
				if v, ok := p.Values[rec.Metric]; ok {
					c.Points = append(c.Points, sweepplot.Point{Step: p.Step, Value: v})
				}
			}
		}
		curves = append(curves, c)
	}
	return curves, rec, nil
}

// stopNote shortens a stop reason for the legend: "ASHA at step 40".
func stopNote(t controller.Trial) string {
	r := strings.TrimPrefix(t.Reason, "stopped by ")
	if i := strings.Index(r, ":"); i > 0 {
		r = r[:i]
	}
	return r
}
