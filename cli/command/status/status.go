// Package status is `gpujob status JOB`: the members of a training job with
// their GPUs, ranks, round, restarts, state and latest loss.
package status

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"sync"

	"github.com/hashicorp/nomad/api"
	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/command/gpujobs"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/nomadapi"
)

// LogTailBytes is how much of the end of each member's stdout is scanned
// for the latest loss and the result.
const LogTailBytes = 64 << 10

// Status is the document `gpujob status -json` prints. Fields are stable;
// new ones may be added.
type Status struct {
	Job       string `json:"job"`
	Namespace string `json:"namespace"`
	// State: pending, running, complete, failed or stopped (see
	// gpujobs.JobState); NomadStatus is Nomad's own (pending, running,
	// dead).
	State         string `json:"state"`
	NomadStatus   string `json:"nomad_status"`
	Version       uint64 `json:"version"`
	Workers       int    `json:"workers"`         // -1 when the job's meta does not say
	GPUsPerWorker int    `json:"gpus_per_worker"` // -1 when the job's meta does not say
	// Counts is the members by state; Restarts the group restarts used
	// (the most any member's events report).
	Counts   gpujobs.Counts `json:"counts"`
	Restarts int            `json:"restarts"`
	// Result is rank 0's gpujob-result line (accuracy, f1, wall_seconds,
	// …) once printed, else null.
	Result  map[string]any `json:"result"`
	Members []Member       `json:"members"`
}

// Member is one allocation of the training group.
type Member struct {
	AllocID string `json:"alloc_id"`
	Name    string `json:"name"` // e.g. bert.train[1]
	NodeID  string `json:"node_id"`
	Node    string `json:"node"`
	// GPUs are the devices Nomad reserved to the task (full UUIDs).
	GPUs []gpujobs.GPU `json:"gpus"`
	// NodeRank, Ranks, WorldSize, Round and Master come from the latest
	// "joined round" event: null/empty/0 before the member joined.
	NodeRank  *int   `json:"node_rank"`
	Ranks     []int  `json:"ranks"`
	WorldSize int    `json:"world_size"`
	Round     int    `json:"round"`
	Master    string `json:"master,omitempty"`
	Restarts  int    `json:"restarts"`
	// State: pending, running, complete, failed or lost.
	State         string `json:"state"`
	ClientStatus  string `json:"client_status"`
	DesiredStatus string `json:"desired_status"`
	// Loss is the latest progress line (highest step) of any of the
	// member's ranks; Losses the latest per rank, by rank.
	Loss   *gpujobs.Loss  `json:"loss"`
	Losses []gpujobs.Loss `json:"losses"`
	// LastEvent is the latest task event; Failure the reason the task
	// failed, if it did.
	LastEvent string `json:"last_event"`
	Failure   string `json:"failure,omitempty"`
	// LogError says why the log could not be read (e.g. not started).
	LogError string `json:"log_error,omitempty"`
}

type options struct {
	json bool
}

// NewCmd returns the status command.
func NewCmd(f *factory.Factory) *cobra.Command {
	o := &options{}
	cmd := &cobra.Command{
		Use:   "status JOB",
		Short: "Show a training job's members, ranks, restarts and loss",
		Long: `Status shows one row per member of a training job (the current allocation of
each of its group's names): the allocation, the node, the GPUs reserved to it,
its node rank and global ranks, the rendezvous round, the group restarts used,
its state, and the latest loss it printed. Ranks, round and restarts come
from the gpujob driver's task events; the loss from the end of the member's
stdout. The summary line gives the job's state and, once rank 0 printed it,
the result (accuracy, F1, wall time).

--json prints the same as one JSON document for scripts (full GPU UUIDs).`,
		Example: `  gpujob status bert-finetune
  gpujob status bert-finetune --json | jq '.members[] | {name, ranks, state}'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return run(ctxOf(cmd), f, o, args[0])
		},
	}
	cmd.Flags().BoolVar(&o.json, "json", false, "print JSON")
	return cmd
}

func ctxOf(cmd *cobra.Command) context.Context {
	if ctx := cmd.Context(); ctx != nil {
		return ctx
	}
	return context.Background()
}

func run(ctx context.Context, f *factory.Factory, o *options, jobID string) error {
	nomad, err := f.Nomad()
	if err != nil {
		return err
	}
	st, err := Collect(ctx, nomad, jobID)
	if err != nil {
		return err
	}
	if o.json {
		return gpujobs.PrintJSON(f.IO.Out, st)
	}
	return printStatus(f.IO.Out, st)
}

// Collect reads a job's status.
func Collect(ctx context.Context, nomad nomadapi.API, jobID string) (*Status, error) {
	job, err := gpujobs.LoadJob(nomad, jobID)
	if err != nil {
		return nil, err
	}
	task := gpujobs.TaskName(job)
	members, err := gpujobs.Members(nomad, job)
	if err != nil {
		return nil, err
	}
	st := &Status{
		Job:           *job.ID,
		Namespace:     deref(job.Namespace),
		NomadStatus:   deref(job.Status),
		Workers:       gpujobs.MetaInt(job.Meta, gpujobs.MetaWorkers),
		GPUsPerWorker: gpujobs.MetaInt(job.Meta, gpujobs.MetaGPUsPerWorker),
		Members:       make([]Member, len(members)),
	}
	if job.Version != nil {
		st.Version = *job.Version
	}

	results := make([]map[string]any, len(members))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	errs := make([]error, len(members))
	for i, m := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			st.Members[i], results[i], errs[i] = member(ctx, nomad, m, task)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	for i, m := range st.Members {
		st.Counts.Add(m.State)
		st.Restarts = max(st.Restarts, m.Restarts)
		if results[i] != nil && (st.Result == nil || hasRank(m, 0)) {
			st.Result = results[i]
		}
	}
	st.State = gpujobs.JobState(job.Stop != nil && *job.Stop, st.Counts, st.Workers)
	return st, nil
}

func hasRank(m Member, r int) bool {
	for _, x := range m.Ranks {
		if x == r {
			return true
		}
	}
	return false
}

// member reads one member's allocation and log tail. A log that cannot be
// read is noted, not fatal; an allocation that cannot be read is.
func member(ctx context.Context, nomad nomadapi.API, m *gpujobs.Member, task string) (Member, map[string]any, error) {
	if err := m.Load(nomad, task); err != nil {
		if !gpujobs.IsNotFound(err) {
			return Member{}, nil, err
		}
		// collected by Nomad's GC since the list was read: what the list
		// says is all there is
		m.Alloc = &api.Allocation{ID: m.Stub.ID, Name: m.Stub.Name, TaskStates: m.Stub.TaskStates}
	}
	p := m.Progress
	out := Member{
		AllocID:       m.ID(),
		Name:          m.Stub.Name,
		NodeID:        m.Stub.NodeID,
		Node:          m.Stub.NodeName,
		GPUs:          gpujobs.AllocGPUs(m.Alloc, task),
		Ranks:         p.Ranks(),
		WorldSize:     p.WorldSize,
		Round:         p.Round,
		Master:        p.Master,
		Restarts:      p.Restarts,
		State:         m.State(),
		ClientStatus:  m.Stub.ClientStatus,
		DesiredStatus: m.Stub.DesiredStatus,
		LastEvent:     p.LastEvent,
		Failure:       p.Failure,
		Losses:        []gpujobs.Loss{},
	}
	if out.GPUs == nil {
		out.GPUs = []gpujobs.GPU{}
	}
	if out.Ranks == nil {
		out.Ranks = []int{}
	}
	if p.Joined {
		nr := p.NodeRank
		out.NodeRank = &nr
	}
	switch {
	case out.State == "complete":
		out.Failure = "" // e.g. killed by a stop: not a failure
	case out.Failure == "" && out.State == "failed":
		out.Failure = m.Stub.ClientDescription
	}
	if !gpujobs.Started(m.Alloc.TaskStates, task) || m.Alloc.NodeID == "" {
		return out, nil, nil
	}
	text, err := gpujobs.ReadLog(ctx, nomad, m.Alloc, task, "stdout", LogTailBytes)
	if err != nil {
		if ctx.Err() != nil {
			return Member{}, nil, ctx.Err()
		}
		out.LogError = err.Error()
	}
	losses, result := gpujobs.Scan(text)
	if p.Joined && p.FirstRank == p.LastRank {
		// one process: its lines carry rank= already; fill a missing one
		for i := range losses {
			if losses[i].Rank < 0 {
				losses[i].Rank = p.FirstRank
			}
		}
	}
	if losses != nil {
		out.Losses = losses
		latest := losses[0]
		for _, l := range losses[1:] {
			if l.Step > latest.Step {
				latest = l
			}
		}
		out.Loss = &latest
	}
	return out, result, nil
}

func printStatus(w io.Writer, st *Status) error {
	shape := ""
	if st.Workers > 0 && st.GPUsPerWorker >= 0 {
		shape = fmt.Sprintf(", %d worker(s) × %d GPU(s)", st.Workers, st.GPUsPerWorker)
	}
	fmt.Fprintf(w, "Job %s: %s (version %d%s): %s", st.Job, st.State, st.Version, shape, st.Counts.Text())
	if st.Restarts > 0 {
		fmt.Fprintf(w, ", %d group restart(s)", st.Restarts)
	}
	fmt.Fprintln(w)
	if st.Result != nil {
		fmt.Fprintf(w, "Result: %s\n", ResultText(st.Result))
	}
	if len(st.Members) == 0 {
		if st.State == "stopped" {
			fmt.Fprintln(w, "No allocations.")
		} else {
			fmt.Fprintln(w, "No allocations yet: the job is queued (gpujob gpus shows what holds the GPUs).")
		}
		return nil
	}
	fmt.Fprintln(w)
	t := gpujobs.NewTable(w, "ALLOC", "NAME", "NODE", "GPUS", "NODE RANK", "RANKS", "ROUND", "RESTARTS", "STATE", "LOSS")
	for _, m := range st.Members {
		nodeRank, round := "-", "-"
		if m.NodeRank != nil {
			nodeRank = strconv.Itoa(*m.NodeRank)
			round = strconv.Itoa(m.Round)
		}
		loss := "-"
		if m.Loss != nil {
			loss = fmt.Sprintf("%.4f (step %d)", m.Loss.Loss, m.Loss.Step)
		}
		t.Row(gpujobs.ShortID(m.AllocID), m.Name, m.Node, gpujobs.GPUsText(m.GPUs), nodeRank, ranksText(m.Ranks),
			round, strconv.Itoa(m.Restarts), m.State, loss)
	}
	if err := t.Flush(); err != nil {
		return err
	}
	// Why a member is not running (or not yet ranked), from its events.
	var notes []string
	for _, m := range st.Members {
		why := ""
		switch {
		case m.Failure != "":
			why = m.Failure
		case m.State == "running" && m.NodeRank == nil:
			why = "waiting for the group's rendezvous"
			if m.LastEvent != "" {
				why += " (" + m.LastEvent + ")"
			}
		case m.State == "pending" || m.State == "lost":
			why = m.LastEvent
		}
		if why != "" {
			notes = append(notes, fmt.Sprintf("  %s (%s): %s", m.Name, gpujobs.ShortID(m.AllocID), why))
		}
		if m.LogError != "" {
			notes = append(notes, fmt.Sprintf("  %s (%s): %s", m.Name, gpujobs.ShortID(m.AllocID), m.LogError))
		}
	}
	if len(notes) > 0 {
		fmt.Fprintln(w, "\nNotes:")
		for _, n := range notes {
			fmt.Fprintln(w, n)
		}
	}
	return nil
}

// ResultText is "accuracy 0.9400, F1 0.9400, wall 12.3s" from a result line.
func ResultText(r map[string]any) string {
	s := ""
	add := func(part string) {
		if s != "" {
			s += ", "
		}
		s += part
	}
	if v, ok := gpujobs.ResultNumber(r, "accuracy"); ok {
		add(fmt.Sprintf("accuracy %.4f", v))
	}
	if v, ok := gpujobs.ResultNumber(r, "f1"); ok {
		add(fmt.Sprintf("F1 %.4f", v))
	}
	if v, ok := gpujobs.ResultNumber(r, "wall_seconds"); ok {
		add(fmt.Sprintf("wall %.1fs", v))
	}
	if v, ok := gpujobs.ResultNumber(r, "restart_count"); ok && v > 0 {
		add(fmt.Sprintf("resumed after %.0f restart(s)", v))
	}
	if s == "" {
		return "(no accuracy/F1 in the result line)"
	}
	return s
}

func ranksText(r []int) string {
	switch len(r) {
	case 0:
		return "-"
	case 1:
		return strconv.Itoa(r[0])
	}
	return fmt.Sprintf("%d-%d", r[0], r[len(r)-1])
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
