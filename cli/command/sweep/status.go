package sweep

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	"github.com/hashicorp/nomad/api"
	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/explain"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/observe"
	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/sweepjob"
	"github.com/gpujob/gpujob/internal/sweep/controller"
	"github.com/gpujob/gpujob/internal/sweep/search"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

// Status is the document `gpujob sweep status -json` prints. Fields are
// stable; new ones may be added.
type Status struct {
	Sweep     string   `json:"sweep"`
	Namespace string   `json:"namespace"`
	Status    string   `json:"status"` // running, completed, failed, stopped
	Reason    string   `json:"reason,omitempty"`
	Metric    string   `json:"metric"`
	Mode      string   `json:"mode"` // max or min
	Goal      *float64 `json:"goal,omitempty"`
	MaxTrials int      `json:"max_trials"`
	Parallel  int      `json:"parallel"`
	// Counts is the trials by state (pending, running, stopping,
	// completed, stopped, failed).
	Counts map[string]int `json:"counts"`
	Best   *Trial         `json:"best"`
	// Controller is its job's Nomad status (running, dead, missing) and
	// how many controllers have held the sweep.
	Controller Controller `json:"controller"`
	Trials     []Trial    `json:"trials"`
}

// Controller is the sweep's controller job.
type Controller struct {
	Job    string `json:"job"`
	Status string `json:"status"`
	Starts int    `json:"starts"`
}

// Trial is one trial.
type Trial struct {
	ID        string            `json:"id"`
	Job       string            `json:"job"`
	State     string            `json:"state"`
	Params    search.Assignment `json:"params"`
	Step      int               `json:"step"`
	Value     *float64          `json:"value"`
	StoppedBy string            `json:"stopped_by,omitempty"`
	Reason    string            `json:"reason,omitempty"`
	// Waiting says in plain words why a trial's job is not running yet.
	Waiting string `json:"waiting,omitempty"`
	// Held is what the trial's metric reporting budgets held back (its
	// rank 0 printed metric or result lines faster, or larger, than they
	// allow): counts of results deferred to the next write, writes delayed
	// by the byte budget, and lines over 64 KiB skipped. Absent when none.
	Held *sweepkv.Reporting `json:"held,omitempty"`
}

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
			if runF != nil {
				return runF(cmd.Context(), o)
			}
			return runStatus(cmd.Context(), f, o)
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
	s, err := e.status(ctx, o.Name)
	if err != nil {
		return err
	}
	if o.JSON {
		return gpujobs.PrintJSON(f.IO.Out, s)
	}
	return printStatus(f.IO.Out, s)
}

// status gathers a sweep's status from Consul, and from Nomad why queued
// trials wait and whether the controller runs.
func (e *env) status(ctx context.Context, name string) (*Status, error) {
	rec, st, _, err := e.load(ctx, name)
	if err != nil {
		return nil, err
	}
	s := newStatus(rec, st)
	s.Controller.Job = controller.ControllerJobID(name)
	s.Controller.Status = "missing"
	if j, err := e.nomad.Job(s.Controller.Job); err == nil && j.Status != nil {
		s.Controller.Status = *j.Status
	} else if err != nil && !gpujobs.IsNotFound(err) {
		return nil, err
	}
	if err := e.explainWaiting(rec, s); err != nil {
		return nil, err
	}
	return s, nil
}

func newStatus(rec *sweepjob.Record, st *controller.State) *Status {
	s := &Status{Sweep: rec.Sweep, Namespace: rec.Namespace, Status: string(st.Status), Reason: st.Reason, Metric: rec.Metric,
		Mode: string(rec.Mode), Goal: rec.Goal, MaxTrials: st.MaxTrials, Parallel: rec.Parallel, Counts: map[string]int{},
		Controller: Controller{Starts: st.Starts}, Trials: []Trial{}}
	if s.Mode == "" {
		s.Mode = "max"
	}
	for _, t := range st.Trials {
		s.Counts[string(t.State)]++
		s.Trials = append(s.Trials, Trial{ID: t.ID, Job: t.JobID, State: string(t.State), Params: t.Params, Step: t.Step,
			Value: t.Value, StoppedBy: t.StoppedBy, Reason: t.Reason, Waiting: t.Waiting, Held: t.Held})
	}
	if b := st.Best(rec.Maximize()); b != nil {
		for i := range s.Trials {
			if s.Trials[i].ID == b.ID {
				s.Best = &s.Trials[i]
			}
		}
	}
	return s
}

// explainWaiting says why the running trials whose jobs have nothing
// running wait: Nomad's plan of the job, in the words `gpujob submit` uses.
func (e *env) explainWaiting(rec *sweepjob.Record, s *Status) error {
	stubs, _, err := e.nomad.Jobs(&api.QueryOptions{Prefix: rec.Sweep + "-trial-"})
	if err != nil {
		return err
	}
	queued := map[string]bool{}
	for _, j := range stubs {
		if j.Stop || j.Status == "dead" || j.JobSummary == nil {
			continue
		}
		for _, g := range j.JobSummary.Summary {
			if g.Queued > 0 {
				queued[j.ID] = true
			}
		}
	}
	if len(queued) == 0 {
		return nil
	}
	nodes, err := observe.ClusterGPUs(e.nomad)
	if err != nil {
		return err
	}
	ask := explain.Ask{Workers: rec.Workers, GPUsPerWorker: rec.GPUsPerWorker}
	if t := rec.Template; t != nil && t.NodePool != nil {
		ask.NodePool = *t.NodePool
	}
	for i := range s.Trials {
		t := &s.Trials[i]
		if !queued[t.Job] {
			continue
		}
		job, err := e.nomad.Job(t.Job)
		if err != nil {
			continue
		}
		plan, err := e.nomad.Plan(job)
		if err != nil {
			continue
		}
		if why := explain.Placement(ask, plan.FailedTGAllocs[render.Group], nodes); why != "" {
			t.Waiting = why
		} else {
			t.Waiting = "Nomad has not placed it yet"
		}
	}
	return nil
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
