package sweep

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/cmdutil"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/sweepops"
	"github.com/gpujob/gpujob/internal/sweep/controller"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

// Status is the document `gpujob sweep status -json` prints.
type Status = sweepops.Status

// Trial is one trial of Status.
type Trial = sweepops.Trial

// StatusOptions is what `sweep status`' arguments and flags ask for.
type StatusOptions struct {
	// Name is the sweep (the argument).
	Name string
	JSON bool
}

func newStatusCmd(f *factory.Factory) *cobra.Command { return NewStatusCmd(f, nil) }

// NewStatusCmd is the command running runF instead when runF is not nil: a
// test checks the Options the arguments parse into without running.
func NewStatusCmd(f *factory.Factory, runF func(context.Context, *StatusOptions) error) *cobra.Command {
	o := &StatusOptions{}
	cmd := &cobra.Command{
		Use:   "status SWEEP",
		Short: "Show a sweep's trials: parameters, state, step, metric, who stopped them",
		Example: `  gpujob sweep status toy-lr
  gpujob sweep status toy-lr -json | jq '.trials[] | select(.state == "completed")'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Name = args[0]
			return cmdutil.Run(cmd.Context(), o, runF, func(ctx context.Context) error { return runStatus(ctx, f, o) })
		},
	}
	cmd.Flags().BoolVar(&o.JSON, "json", false, "print JSON")
	return cmd
}

func runStatus(ctx context.Context, f *factory.Factory, o *StatusOptions) error {
	e, err := newEnv(f, true)
	if err != nil {
		return err
	}
	s, err := e.sweeps().ReadStatus(ctx, o.Name)
	if err != nil {
		return err
	}
	if o.JSON {
		return gpujobs.PrintJSON(f.IO.Out, s)
	}
	return printStatus(f.IO.Out, s)
}

func printStatus(w io.Writer, s *Status) error {
	fmt.Fprintf(w, "sweep %s: %s", s.Sweep, s.Status)
	if s.Reason != "" {
		fmt.Fprintf(w, " (%s)", s.Reason)
	}
	fmt.Fprintf(w, "\ntrials: %s of at most %d, %d at a time\n", countsText(s.Counts), s.MaxTrials, s.Parallel)
	goal := ""
	if s.Goal != nil {
		goal = ", goal " + formatValue(s.Goal)
	}
	fmt.Fprintf(w, "objective: %s %s%s\n", s.Mode, s.Metric, goal)
	if s.Best != nil {
		fmt.Fprintf(w, "best: %s %s %s (%s, %s)\n", s.Best.ID, s.Metric, formatValue(s.Best.Value), s.Best.Params, s.Best.State)
	}
	fmt.Fprintf(w, "controller: job %s %s, %d start(s)\n\n", s.Controller.Job, s.Controller.Status, s.Controller.Starts)
	names := paramNames(s.Trials)
	header := append([]string{"TRIAL", "STATE"}, upper(names)...)
	header = append(header, "STEP", strings.ToUpper(s.Metric), "NOTE")
	tab := gpujobs.NewTable(w, header...)
	for _, t := range s.Trials {
		row := []string{t.ID, t.State}
		for _, n := range names {
			row = append(row, t.Params[n].String())
		}
		note := t.Reason
		if t.Waiting != "" {
			note = "waiting: " + t.Waiting
		}
		if s.Best != nil && t.ID == s.Best.ID {
			note = strings.TrimSpace("best " + note)
		}
		if h := heldText(t.Held); h != "" {
			note = strings.TrimSpace(note + "; " + h)
			note = strings.TrimPrefix(note, "; ")
		}
		row = append(row, strconv.Itoa(t.Step), formatValue(t.Value), note)
		tab.Row(row...)
	}
	return tab.Flush()
}

func countsText(c map[string]int) string {
	var parts []string
	for _, s := range []controller.TrialState{controller.TrialPending, controller.TrialRunning, controller.TrialStopping,
		controller.TrialCompleted, controller.TrialStopped, controller.TrialFailed} {
		if n := c[string(s)]; n > 0 {
			label := string(s)
			if s == controller.TrialStopped {
				label = "stopped early"
			}
			parts = append(parts, fmt.Sprintf("%d %s", n, label))
		}
	}
	if len(parts) == 0 {
		return "none yet"
	}
	return strings.Join(parts, ", ")
}

func paramNames(trials []Trial) []string {
	seen := map[string]bool{}
	var names []string
	for _, t := range trials {
		for n := range t.Params {
			if !seen[n] {
				seen[n] = true
				names = append(names, n)
			}
		}
	}
	sort.Strings(names)
	return names
}

func upper(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = strings.ToUpper(s)
	}
	return out
}

func formatValue(v *float64) string {
	if v == nil {
		return "-"
	}
	return strconv.FormatFloat(*v, 'g', 4, 64)
}

// heldText says what a trial's reporting budgets held back, or "".
func heldText(h *sweepkv.Reporting) string {
	if h == nil || !h.Throttled() {
		return ""
	}
	var parts []string
	for _, c := range []struct {
		n    int64
		what string
	}{{h.ResultsDeferred, "result write(s) deferred"}, {h.ByteBudgetWaits, "write(s) delayed by the byte budget"},
		{h.DroppedLines, "line(s) over 64 KiB skipped"}} {
		if c.n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", c.n, c.what))
		}
	}
	return "metrics reporting throttled: " + strings.Join(parts, ", ")
}
