// Package logs is `gpujob logs JOB`: every member's log merged, each line
// prefixed with its rank; one rank's lines; follow mode.
package logs

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
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/internal/contract"
)

// Options is what the command's arguments and flags ask for.
type Options struct {
	// Job is the job ID (the argument).
	Job    string
	Rank   int
	Follow bool
	Stderr bool
}

// NewCmd returns the logs command.
func NewCmd(f *factory.Factory) *cobra.Command { return NewCmdWith(f, nil) }

// NewCmdWith is NewCmd running runF instead of the command when runF is not
// nil: a test checks the Options the arguments parse into without running.
func NewCmdWith(f *factory.Factory, runF func(context.Context, *Options) error) *cobra.Command {
	o := &Options{}
	cmd := &cobra.Command{
		Use:   "logs JOB",
		Short: "Show a training job's logs, prefixed by rank",
		Long: `Logs prints the stdout (or, with --stderr, the stderr) of every member of a
training job, each line prefixed with the global rank that wrote it: "[rank N] ".
A member running several processes prefixes its lines itself; a member running
one takes its rank from the driver's "joined round" event. Lines a member's
supervisor writes for all of its ranks are prefixed "[ranks A-B] ", and lines
of a member that has not joined a round yet with its allocation name.

Without --follow the members' logs are printed one after the other, in node
rank order. --rank N prints only rank N's lines. --follow streams every member
at once, whole lines at a time, including members that start later
(replacements), until each member's task has ended or Ctrl-C.`,
		Example: `  gpujob logs bert-finetune
  gpujob logs bert-finetune --rank 1
  gpujob logs bert-finetune -f --stderr`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("rank") {
				o.Rank = -1
			} else if o.Rank < 0 {
				return fmt.Errorf("--rank must be 0 or more, not %d", o.Rank)
			}
			o.Job = args[0]
			return cmdutil.Run(cmd.Context(), o, runF, func(ctx context.Context) error { return run(ctx, f, o, o.Job) })
		},
	}
	cmd.Flags().IntVar(&o.Rank, "rank", 0, "show only this global `rank`'s lines")
	cmd.Flags().BoolVarP(&o.Follow, "follow", "f", false, "keep streaming new lines")
	cmd.Flags().BoolVar(&o.Stderr, "stderr", false, "show stderr instead of stdout")
	return cmd
}

func run(ctx context.Context, f *factory.Factory, o *Options, jobID string) error {
	nomad, err := f.Nomad()
	if err != nil {
		return err
	}
	job, err := gpujobs.LoadJob(nomad, jobID)
	if err != nil {
		return err
	}
	task := gpujobs.TaskName(job)
	stubs, meta, err := nomad.JobAllocations(*job.ID, nil)
	if err != nil {
		return err
	}
	version := uint64(0)
	if job.Version != nil {
		version = *job.Version
	}
	members := gpujobs.SelectMembers(stubs, version, task)
	stream := "stdout"
	if o.Stderr {
		stream = "stderr"
	}
	l := &logger{
		nomad: nomad, task: task, stream: stream, rank: o.Rank, version: version,
		out: &lineWriter{w: f.IO.Out}, errOut: f.IO.ErrOut, job: *job.ID,
	}
	if o.Rank >= 0 {
		if err := l.checkRank(members, o.Follow); err != nil {
			return err
		}
	}
	if !o.Follow {
		return l.dump(ctx, members)
	}
	index := uint64(0)
	if meta != nil {
		index = meta.LastIndex
	}
	return l.follow(ctx, stubs, index)
}

// logger prints members' logs with rank prefixes.
type logger struct {
	nomad   nomadapi.API
	job     string
	task    string
	stream  string
	rank    int // -1: all
	version uint64
	out     *lineWriter
	errOut  io.Writer
}

// checkRank fails when no member holds the rank. A job none of whose members
// has joined yet has no ranks: dump fails, follow waits for them.
func (l *logger) checkRank(members []*gpujobs.Member, follow bool) error {
	joined, maxRank := 0, -1
	for _, m := range members {
		if m.Progress.HasRank(l.rank) {
			return nil
		}
		if m.Progress.Joined {
			joined++
			maxRank = max(maxRank, m.Progress.LastRank, m.Progress.WorldSize-1)
		}
	}
	switch {
	case joined == 0 && follow:
		return nil
	case joined == 0:
		return fmt.Errorf("no member of job %q has joined a rendezvous round yet, so no rank is assigned: try `gpujob status %s`, or --follow to wait",
			l.job, l.job)
	case joined < len(members) && follow:
		return nil // the rank may belong to a member still joining
	}
	return fmt.Errorf("job %q has no rank %d: its ranks are 0-%d", l.job, l.rank, maxRank)
}

// wants reports whether a member's log can hold lines of the selected rank.
func (l *logger) wants(p gpujobs.Progress) bool {
	return l.rank < 0 || !p.Joined || p.HasRank(l.rank)
}

// source is one member's log being read.
type source struct {
	l    *logger
	stub *api.AllocationListStub
	mu   sync.Mutex
	prog gpujobs.Progress
}

func (s *source) progress() gpujobs.Progress {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.prog
}

func (s *source) setProgress(p gpujobs.Progress) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p.Joined || !s.prog.Joined {
		s.prog = p
	}
}

// format prefixes a line with its rank; keep is false when --rank filters it
// out. resolve re-reads the allocation's events when the member's ranks are
// not known yet (follow mode: a member that joined after the start).
func (s *source) format(line string, resolve bool) (string, bool) {
	if p, ok := gpujobs.ParseJoined(line); ok {
		s.setProgress(p)
	}
	if r, _, ok := gpujobs.SplitRankPrefix(line); ok {
		return line, s.l.rank < 0 || r == s.l.rank
	}
	p := s.progress()
	if !p.Joined && resolve {
		if a, err := s.l.nomad.Allocation(s.stub.ID); err == nil {
			if ts := a.TaskStates[s.l.task]; ts != nil {
				s.setProgress(gpujobs.ParseEvents(ts.Events))
				p = s.progress()
			}
		}
	}
	switch {
	case !p.Joined:
		return "[" + s.stub.Name + "] " + line, s.l.rank < 0
	case p.FirstRank == p.LastRank:
		return contract.RankLinePrefix + strconv.Itoa(p.FirstRank) + "] " + line, s.l.rank < 0 || p.FirstRank == s.l.rank
	default:
		// the member's supervisor speaking for all its ranks
		return "[ranks " + p.RanksText() + "] " + line, s.l.rank < 0
	}
}

// dump prints every selected member's log to its current end, member after
// member in node rank order.
func (l *logger) dump(ctx context.Context, members []*gpujobs.Member) error {
	type result struct {
		lines []string
		err   error
	}
	var sel []*gpujobs.Member
	for _, m := range members {
		if !l.wants(m.Progress) {
			continue
		}
		if ts := m.Stub.TaskStates[l.task]; ts == nil || ts.StartedAt.IsZero() {
			fmt.Fprintf(l.errOut, "%s (%s) has not started yet: no logs (%s)\n", m.Stub.Name, gpujobs.ShortID(m.ID()), m.State())
			continue
		}
		sel = append(sel, m)
	}
	results := make([]result, len(sel))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i, m := range sel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			alloc, err := l.nomad.Allocation(m.ID())
			if err != nil {
				results[i].err = err
				return
			}
			s := &source{l: l, stub: m.Stub, prog: m.Progress}
			results[i].err = gpujobs.StreamLines(ctx, l.nomad, alloc, l.task, l.stream, false, func(line string) {
				if out, keep := s.format(line, false); keep {
					results[i].lines = append(results[i].lines, out)
				}
			})
		}()
	}
	wg.Wait()
	var firstErr error
	failed := 0
	for i, r := range results {
		for _, line := range r.lines {
			l.out.line(line)
		}
		if r.err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			failed++
			firstErr = cmpErr(firstErr, r.err)
			fmt.Fprintf(l.errOut, "%s (%s): %v\n", sel[i].Stub.Name, gpujobs.ShortID(sel[i].ID()), r.err)
		}
	}
	if failed > 0 && failed == len(sel) {
		return firstErr
	}
	return nil
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// follower streams one allocation's log until its task ends.
type follower struct {
	src      *source
	terminal chan struct{} // closed when the allocation is terminal
	closed   bool
}

func (fw *follower) markTerminal() {
	if !fw.closed {
		fw.closed = true
		close(fw.terminal)
	}
}

// run follows the log; once the allocation is terminal (Nomad keeps a
// follow stream open after the task ended) it stops following and reads the
// rest of the log without follow, skipping what it already printed.
func (fw *follower) run(ctx context.Context) error {
	l := fw.src.l
	alloc, err := l.nomad.Allocation(fw.src.stub.ID)
	if err != nil {
		return err
	}
	var sp gpujobs.LineSplitter
	emit := func(data []byte) {
		for _, line := range sp.Write(data) {
			if out, keep := fw.src.format(line, true); keep {
				l.out.line(out)
			}
		}
	}
	consumed := 0
	followCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		select {
		case <-fw.terminal:
			stop()
		case <-followCtx.Done():
		}
	}()
	follow := !gpujobs.Terminal(alloc.ClientStatus)
	err = gpujobs.StreamFrames(followCtx, l.nomad, alloc, l.task, l.stream, follow, func(data []byte) {
		consumed += len(data)
		emit(data)
	})
	if ctx.Err() != nil {
		return nil // Ctrl-C
	}
	if follow && (err == nil || followCtx.Err() != nil) {
		// the rest, written between the last frame and the task's end
		skip := consumed
		err = gpujobs.StreamFrames(ctx, l.nomad, alloc, l.task, l.stream, false, func(data []byte) {
			if skip >= len(data) {
				skip -= len(data)
				return
			}
			emit(data[skip:])
			skip = 0
		})
		if ctx.Err() != nil {
			return nil
		}
	}
	if line, ok := sp.Flush(); ok {
		if out, keep := fw.src.format(line, true); keep {
			l.out.line(out)
		}
	}
	return err
}

type allocUpdate struct {
	stubs []*api.AllocationListStub
	err   error
}

// follow streams every member's log, starting followers as members start,
// until every member is terminal and its log read, or ctx ends.
func (l *logger) follow(ctx context.Context, stubs []*api.AllocationListStub, index uint64) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	followers := map[string]*follower{}
	done := make(chan error)
	active := 0
	var current []*gpujobs.Member

	handle := func(stubs []*api.AllocationListStub) {
		for _, s := range stubs {
			if fw, ok := followers[s.ID]; ok {
				if ts := s.TaskStates[l.task]; ts != nil {
					fw.src.setProgress(gpujobs.ParseEvents(ts.Events))
				}
				if gpujobs.Terminal(s.ClientStatus) {
					fw.markTerminal()
				}
			}
		}
		current = gpujobs.SelectMembers(stubs, l.version, l.task)
		for _, m := range current {
			if _, ok := followers[m.ID()]; ok || !gpujobs.Started(m.Stub.TaskStates, l.task) || !l.wants(m.Progress) {
				continue
			}
			fw := &follower{src: &source{l: l, stub: m.Stub, prog: m.Progress}, terminal: make(chan struct{})}
			if gpujobs.Terminal(m.Stub.ClientStatus) {
				fw.markTerminal()
			}
			followers[m.ID()] = fw
			active++
			go func() {
				err := fw.run(ctx)
				if err != nil {
					err = fmt.Errorf("%s (%s): %w", m.Stub.Name, gpujobs.ShortID(m.ID()), err)
				}
				select {
				case done <- err:
				case <-ctx.Done():
				}
			}()
		}
	}
	finished := func() bool {
		if active > 0 || len(current) == 0 {
			return false
		}
		for _, m := range current {
			if !gpujobs.Terminal(m.Stub.ClientStatus) || awaitsReplacement(m.Stub) {
				return false
			}
		}
		return true
	}

	updates := make(chan allocUpdate)
	go func() {
		for {
			// a blocking query: returns when the job's allocations change
			// (or after WaitTime, with the same index)
			s, meta, err := l.nomad.JobAllocations(l.job, &api.QueryOptions{WaitIndex: index, WaitTime: 5 * time.Minute})
			if ctx.Err() != nil {
				return
			}
			if err == nil && meta != nil {
				if meta.LastIndex == index {
					continue
				}
				index = meta.LastIndex
			}
			select {
			case updates <- allocUpdate{stubs: s, err: err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()

	handle(stubs)
	for !finished() {
		select {
		case <-ctx.Done():
			return nil
		case err := <-done:
			active--
			if err != nil {
				fmt.Fprintf(l.errOut, "gpujob: %v\n", err)
			}
		case u := <-updates:
			if u.err != nil {
				return u.err
			}
			handle(u.stubs)
		}
	}
	return nil
}

// awaitsReplacement: Nomad will reschedule the failed allocation later (a
// follow-up evaluation is set and no replacement exists yet).
func awaitsReplacement(s *api.AllocationListStub) bool {
	return s.ClientStatus == "failed" && s.DesiredStatus == "run" && s.FollowupEvalID != "" && s.NextAllocation == ""
}

// lineWriter writes whole lines, one Write each, from many goroutines.
type lineWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (w *lineWriter) line(s string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, _ = io.WriteString(w.w, strings.TrimRight(s, "\n")+"\n")
}
