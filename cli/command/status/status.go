// Package status is `gpujob status JOB`: the members of a training job with
// their GPUs, ranks, round, restarts, state and latest loss.
package status

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/cmdutil"
	"github.com/gpujob/gpujob/cli/explain"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/observe"
	"github.com/gpujob/gpujob/cli/queues"
	"github.com/gpujob/gpujob/internal/contract"
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
	// Unplaced is how many of the group's members Nomad has not placed
	// (no allocation yet) while the job is not stopped; Waiting says why,
	// from a dry-run plan of the job against the cluster's GPUs, in the
	// words `gpujob submit` uses ("needs 4 × 1 nvidia/gpu …; node a has 3
	// of 4 free, 1 held by job x").
	Unplaced int    `json:"unplaced"`
	Waiting  string `json:"waiting,omitempty"`
	// Queue is the job's place in its queue when a queue configuration
	// made it a queued job (internal/queue/admit): queued with position,
	// reason and estimated start, admitted, preempted (by whom, why) or
	// refused; absent for a job registered directly. A job the queue has
	// not admitted yet has no Nomad job: its State is "queued" (or
	// "refused") and NomadStatus is empty.
	Queue *queues.Info `json:"queue,omitempty"`
	// queueLine is Queue in a sentence, for people.
	queueLine string

	// GPU utilisation of a running job: the GPUs reserved to its running
	// members, read from their nodes' stats (one read per node).
	// GPUUtilizationPct is their mean, null when the job is not running or
	// no figure could be read (GPUUtilizationNote then says why);
	// GPUUtilization is each GPU's figure (utilization_pct null where it
	// could not be read); LowGPUUtilization says the mean is under
	// UtilizationTargetPct.
	GPUUtilizationPct  *float64  `json:"gpu_utilization_pct"`
	GPUUtilization     []GPUUtil `json:"gpu_utilization"`
	LowGPUUtilization  bool      `json:"low_gpu_utilization"`
	GPUUtilizationNote string    `json:"gpu_utilization_note,omitempty"`
	// LossSpread is max − min of the latest loss of each rank, null with
	// fewer than 2 ranks' losses. The losses are compared as read (each
	// rank's latest line), so LossStepsDiffer says when those lines are not
	// all at one step: the spread then partly measures the steps between
	// them, and LossSpreadHigh (over LossSpreadBar at one step: the ranks
	// disagree) is not raised.
	LossSpread      *float64 `json:"loss_spread"`
	LossStepsDiffer bool     `json:"loss_steps_differ"`
	LossSpreadHigh  bool     `json:"loss_spread_high"`
	// lossSteps are the lowest and highest step of those latest losses.
	lossSteps [2]int
}

// UtilizationTargetPct is the mean GPU utilisation under which status warns.
const UtilizationTargetPct = observe.LowUtilizationPct

// LossSpreadBar is the spread of the ranks' latest losses over which status
// warns that they disagree.
const LossSpreadBar = observe.LossSpreadBar

// GPUUtil is one GPU of a running member and its utilisation.
type GPUUtil struct {
	ID     string `json:"id"`
	Node   string `json:"node"`
	Member string `json:"member"` // the allocation's name, e.g. bert.train[1]
	// UtilizationPct is null when the node's stats could not be read or the
	// device gave none ("N/A").
	UtilizationPct *float64 `json:"utilization_pct"`
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

// Options is what the command's arguments and flags ask for.
type Options struct {
	// Job is the job ID (the argument).
	Job  string
	JSON bool
}

// NewCmd returns the status command.
func NewCmd(f *factory.Factory) *cobra.Command { return NewCmdWith(f, nil) }

// NewCmdWith is NewCmd running runF instead of the command when runF is not
// nil: a test checks the Options the arguments parse into without running.
func NewCmdWith(f *factory.Factory, runF func(context.Context, *Options) error) *cobra.Command {
	o := &Options{}
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

For a running job status reads its GPUs' utilisation from their nodes' stats
and warns, with each GPU's figure, when the mean is under 80 % (a starved
input pipeline or a too-small batch), or notes that it could not be read. With
two ranks' losses or more it prints their spread (max − min of each rank's
latest loss) and warns over 0.05, unless the ranks' latest losses are from
different steps, which it says instead.

Members Nomad has not placed yet are counted, with why: a dry-run plan of the
job against the cluster's GPUs, in submit's words ("needs 4 × 1 nvidia/gpu;
3 of 4 could be placed now, 1 cannot; node a has 0 of 4 free, 1 held by job x").

A job that went through a queue (queue mode, gpujob queue) shows its queue
line: queued with its position, its reason in words and an estimated start
(a job still in its queue has no Nomad job yet, only this), admitted, being
preempted (by whom, why) or refused. It reads the record and the admission
controller's status in Consul (a token of gpujob acl policy
consul-queue-submit, --read-only suffices).

--json prints the same as one JSON document for scripts (full GPU UUIDs).`,
		Example: `  gpujob status bert-finetune
  gpujob status bert-finetune --json | jq '.members[] | {name, ranks, state}'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Job = args[0]
			return cmdutil.Run(cmd.Context(), o, runF, func(ctx context.Context) error { return run(ctx, f, o, o.Job) })
		},
	}
	cmd.Flags().BoolVar(&o.JSON, "json", false, "print JSON")
	return cmd
}

func run(ctx context.Context, f *factory.Factory, o *Options, jobID string) error {
	nomad, err := f.Nomad()
	if err != nil {
		return err
	}
	st, err := Collect(ctx, nomad, jobID)
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	entry, qerr := queues.Lookup(qctx, f, jobID)
	switch {
	case err != nil && (entry == nil || entry.State() == "admitted" || entry.State() == "preempted"):
		if qerr != nil && strings.Contains(err.Error(), "not found") {
			// It may be waiting in its queue: say what could not be looked at.
			fmt.Fprintf(f.IO.ErrOut, "warning: its queue record could not be read: %v\n", qerr)
		}
		return err
	case err != nil:
		st = Queued(entry)
	case entry != nil:
		st.Queue = entry.Info()
	}
	if entry != nil {
		st.queueLine = entry.Line(now(f))
	}
	if o.JSON {
		return gpujobs.PrintJSON(f.IO.Out, st)
	}
	return printStatus(f.IO.Out, st)
}

// Queued is the status of a job that is only in its queue: no Nomad job
// yet (queued, waiting for the controller's answer, or refused).
func Queued(e *queues.Entry) *Status {
	in := e.Info()
	state := "queued"
	if in.State == "refused" {
		state = "refused"
	}
	return &Status{Job: e.Record.ID, Namespace: e.Record.Namespace, State: state, Workers: e.Record.Members,
		GPUsPerWorker: e.Record.PerMember.GPUs, Members: []Member{}, GPUUtilization: []GPUUtil{}, Queue: in}
}

func now(f *factory.Factory) time.Time {
	if f.Now != nil {
		return f.Now()
	}
	return time.Now()
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
		Workers:       gpujobs.MetaInt(job.Meta, contract.MetaWorkers),
		GPUsPerWorker: gpujobs.MetaInt(job.Meta, contract.MetaGPUsPerWorker),
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
	if err := unplaced(nomad, job, st); err != nil {
		return nil, err
	}
	st.GPUUtilization = []GPUUtil{}
	if st.State == "running" {
		utilization(nomad, st)
	}
	lossSpread(st)
	return st, nil
}

// unplaced counts the group's members that have no allocation while the
// job runs, and asks Nomad (a plan: nothing is placed) why.
func unplaced(nomad nomadapi.API, job *api.Job, st *Status) error {
	if job.Stop != nil && *job.Stop || job.Status != nil && *job.Status == "dead" {
		return nil
	}
	group := groupOf(job, gpujobs.TaskName(job))
	if group == nil || group.Count == nil {
		return nil
	}
	live := 0
	for _, m := range st.Members {
		if m.DesiredStatus == "" || m.DesiredStatus == api.AllocDesiredStatusRun {
			live++
		}
	}
	st.Unplaced = max(*group.Count-live, 0)
	if st.Unplaced == 0 {
		return nil
	}
	nodes, err := observe.ClusterGPUs(nomad)
	if err != nil {
		return err
	}
	plan, err := nomad.Plan(job)
	if err != nil {
		return err
	}
	ask := explain.Ask{Workers: *group.Count, GPUsPerWorker: max(st.GPUsPerWorker, 0)}
	if job.NodePool != nil {
		ask.NodePool = *job.NodePool
	}
	if group.Name != nil {
		st.Waiting = explain.Placement(ask, plan.FailedTGAllocs[*group.Name], nodes)
	}
	if st.Waiting == "" {
		st.Waiting = "Nomad has not placed them yet (the plan finds room now)"
	}
	return nil
}

// groupOf is the job's task group that holds the task.
func groupOf(job *api.Job, task string) *api.TaskGroup {
	for _, g := range job.TaskGroups {
		for _, t := range g.Tasks {
			if t != nil && t.Name == task {
				return g
			}
		}
	}
	return nil
}

// utilization reads the utilisation of the GPUs reserved to the running
// members: one NodeStats per distinct node, however many GPUs it holds.
func utilization(nomad nomadapi.API, st *Status) {
	type nodeRead struct {
		name  string
		stats *api.HostStats
		err   error
	}
	nodes := map[string]*nodeRead{}
	var order []string
	for _, m := range st.Members {
		if m.State != "running" || len(m.GPUs) == 0 || m.NodeID == "" {
			continue
		}
		if nodes[m.NodeID] == nil {
			nodes[m.NodeID] = &nodeRead{name: m.Node}
			order = append(order, m.NodeID)
		}
	}
	if len(order) == 0 {
		return // no GPU to speak of (e.g. a CPU job, or GPUs not yet reserved)
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for _, id := range order {
		wg.Add(1)
		go func(id string, n *nodeRead) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			n.stats, n.err = nomad.NodeStats(id)
		}(id, nodes[id])
	}
	wg.Wait()

	var pcts []*float64
	for _, m := range st.Members {
		n := nodes[m.NodeID]
		if m.State != "running" || n == nil {
			continue
		}
		for _, g := range m.GPUs {
			u := GPUUtil{ID: g.ID, Node: m.Node, Member: m.Name}
			if n.err == nil {
				u.UtilizationPct = gpuUtil(n.stats, g.ID)
			}
			pcts = append(pcts, u.UtilizationPct)
			st.GPUUtilization = append(st.GPUUtilization, u)
		}
	}
	mean := observe.MeanUtilization(pcts)
	if mean == nil {
		var why []string
		for _, id := range order {
			n := nodes[id]
			name := n.name
			if name == "" {
				name = id
			}
			if n.err != nil {
				why = append(why, fmt.Sprintf("node %s: %v", name, n.err))
			} else {
				why = append(why, fmt.Sprintf("node %s reports no utilisation for the job's GPUs", name))
			}
		}
		st.GPUUtilizationNote = "GPU utilisation unknown: " + strings.Join(why, "; ")
		return
	}
	st.GPUUtilizationPct = mean
	st.LowGPUUtilization = observe.LowUtilization(*mean)
}

// gpuUtil is a GPU's "GPU utilization" stat, nil when absent or "N/A". Device
// IDs are UUIDs: the instance is looked up in every GPU group.
func gpuUtil(hs *api.HostStats, id string) *float64 {
	ds := gpujobs.InstanceStats(hs, "", "", id)
	if ds == nil || ds.Stats == nil {
		return nil
	}
	u, _ := gpujobs.StatNum(ds.Stats.Attributes[contract.StatGPUUtil])
	return u
}

// lossSpread compares the latest loss of each rank, as read from the
// members' logs (observe.LossSpread).
func lossSpread(st *Status) {
	var losses []observe.RankLoss
	for _, m := range st.Members {
		for _, l := range m.Losses {
			losses = append(losses, observe.RankLoss{Rank: l.Rank, Step: l.Step, Loss: l.Loss})
		}
	}
	sp, ok := observe.LossSpread(losses)
	if !ok {
		return
	}
	st.LossSpread = &sp.Spread
	st.LossStepsDiffer = sp.StepsDiffer()
	st.lossSteps = [2]int{sp.MinStep, sp.MaxStep}
	st.LossSpreadHigh = sp.High()
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
	if st.Queue != nil && st.NomadStatus == "" {
		fmt.Fprintf(w, "Job %s: %d worker(s) × %d GPU(s), submitted by %s at %s\n", st.Job, st.Workers, st.GPUsPerWorker,
			st.Queue.SubmittedBy, st.Queue.SubmittedAt.UTC().Format(time.RFC3339))
		fmt.Fprintf(w, "Queue: %s\n", st.queueLine)
		fmt.Fprintf(w, "Nomad has no job %s yet: the admission controller registers it when every member fits at once. gpujob stop %s withdraws it.\n", st.Job, st.Job)
		return nil
	}
	shape := ""
	if st.Workers > 0 && st.GPUsPerWorker >= 0 {
		shape = fmt.Sprintf(", %d worker(s) × %d GPU(s)", st.Workers, st.GPUsPerWorker)
	}
	fmt.Fprintf(w, "Job %s: %s (version %d%s): %s", st.Job, st.State, st.Version, shape, st.Counts.Text())
	if st.Restarts > 0 {
		fmt.Fprintf(w, ", %d group restart(s)", st.Restarts)
	}
	fmt.Fprintln(w)
	if st.queueLine != "" {
		fmt.Fprintf(w, "Queue: %s\n", st.queueLine)
	}
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
	printHealth(w, st)
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
	if st.Unplaced > 0 {
		notes = append(notes, fmt.Sprintf("  %d member(s) not placed: %s", st.Unplaced, st.Waiting))
	}
	if len(notes) > 0 {
		fmt.Fprintln(w, "\nNotes:")
		for _, n := range notes {
			fmt.Fprintln(w, n)
		}
	}
	return nil
}

// printHealth prints, after the table, the job-wide findings: low GPU
// utilisation, utilisation that could not be read, the loss spread.
func printHealth(w io.Writer, st *Status) {
	var lines []string
	switch {
	case st.GPUUtilizationNote != "" && st.State == "running":
		lines = append(lines, "note: "+st.GPUUtilizationNote)
	case st.LowGPUUtilization:
		known := 0
		for _, g := range st.GPUUtilization {
			if g.UtilizationPct != nil {
				known++
			}
		}
		gpus := fmt.Sprintf("%d GPUs average", len(st.GPUUtilization))
		if known < len(st.GPUUtilization) {
			gpus = fmt.Sprintf("%d GPUs (%d of them read) average", len(st.GPUUtilization), known)
		}
		if len(st.GPUUtilization) == 1 {
			gpus = "GPU runs at"
		}
		lines = append(lines, fmt.Sprintf("warning: this job's %s %.0f%% utilisation, under the %d%% target: "+
			"the input pipeline (DataLoader workers, I/O) or a too-small batch may be starving them; see gpujob gpus",
			gpus, *st.GPUUtilizationPct, UtilizationTargetPct))
		for _, g := range st.GPUUtilization {
			pct := "unknown"
			if g.UtilizationPct != nil {
				pct = fmt.Sprintf("%.0f%%", *g.UtilizationPct)
			}
			lines = append(lines, fmt.Sprintf("  %s %s (%s): %s", g.Node, gpujobs.ShortUUID(g.ID), g.Member, pct))
		}
	}
	if st.LossSpread != nil {
		line := fmt.Sprintf("loss spread across ranks: %.3f (max − min of the latest loss per rank; the seeds' bar is %g)",
			*st.LossSpread, LossSpreadBar)
		if st.LossStepsDiffer {
			line += fmt.Sprintf("\n  the ranks' latest losses are from different steps (%d to %d): the spread compares "+
				"them as read, so part of it is training progress, not disagreement", st.lossSteps[0], st.lossSteps[1])
		}
		lines = append(lines, line)
		if st.LossSpreadHigh {
			lines = append(lines, fmt.Sprintf("warning: the ranks' losses disagree by more than %g at one step: "+
				"check the data sharding (each rank its own shard, same size) or a diverging rank", LossSpreadBar))
		}
	}
	if len(lines) == 0 {
		return
	}
	fmt.Fprintln(w)
	for _, l := range lines {
		fmt.Fprintln(w, l)
	}
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
