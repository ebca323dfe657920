package queues

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/gpujob/gpujob/internal/queue/policy"
	"github.com/gpujob/gpujob/internal/queue/queuefile"
	"github.com/gpujob/gpujob/internal/queue/queuekv"
)

// Change is one queue the apply adds, changes or removes.
type Change struct {
	Queue string `json:"queue"`
	// Action is added, changed or removed.
	Action string `json:"action"`
	// Fields are a changed queue's settings that change.
	Fields []FieldChange `json:"fields,omitempty"`
	// Settings are an added queue's.
	Settings *queuekv.Queue `json:"settings,omitempty"`
}

// FieldChange is one setting of a changed queue: gpus 8 → 4.
type FieldChange struct {
	Field string `json:"field"`
	From  string `json:"from"`
	To    string `json:"to"`
}

// The actions of a Change.
const (
	Added   = "added"
	Changed = "changed"
	Removed = "removed"
)

// Diff is what changes from old to new, queue by queue: the added and
// changed ones in new's order, then the removed ones in old's.
func Diff(old, new []queuekv.Queue) (changes []Change, unchanged []string) {
	byName := map[string]queuekv.Queue{}
	for _, q := range old {
		byName[q.Name] = q
	}
	kept := map[string]bool{}
	for _, q := range new {
		kept[q.Name] = true
		o, ok := byName[q.Name]
		switch {
		case !ok:
			s := q
			changes = append(changes, Change{Queue: q.Name, Action: Added, Settings: &s})
		case o == q:
			unchanged = append(unchanged, q.Name)
		default:
			changes = append(changes, Change{Queue: q.Name, Action: Changed, Fields: fieldChanges(o, q)})
		}
	}
	for _, q := range old {
		if !kept[q.Name] {
			changes = append(changes, Change{Queue: q.Name, Action: Removed})
		}
	}
	return changes, unchanged
}

func fieldChanges(o, n queuekv.Queue) []FieldChange {
	var out []FieldChange
	add := func(field, from, to string) {
		if from != to {
			out = append(out, FieldChange{field, from, to})
		}
	}
	add("gpus", quota(o.GPUs), quota(n.GPUs))
	add("weight", fmt.Sprint(o.Weight), fmt.Sprint(n.Weight))
	add("borrow", onOff(o.Borrow), onOff(n.Borrow))
	add("priority", fmt.Sprint(o.Priority), fmt.Sprint(n.Priority))
	add("cohort", or(o.Cohort, "-"), or(n.Cohort, "-"))
	return out
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// ApplyOptions is an apply's file and circumstances.
type ApplyOptions struct {
	// Path names the file in the record and in messages.
	Path string
	File *queuefile.File
	// DryRun reads and compares, and writes nothing.
	DryRun bool
	// AppliedBy and Now go into the record.
	AppliedBy string
	Now       time.Time
}

// ApplyResult is what an apply did (`gpujob queue apply -json`).
type ApplyResult struct {
	File    string `json:"file"`
	SHA256  string `json:"sha256"`
	DryRun  bool   `json:"dry_run"`
	Written bool   `json:"written"`
	// Index is the Consul index the configuration was written at (0: not
	// written).
	Index     uint64   `json:"index,omitempty"`
	Changes   []Change `json:"changes"`
	Unchanged []string `json:"unchanged"`
	// Previous says where the configuration it replaces came from (null:
	// there was none, or it was invalid).
	Previous *Applied `json:"previous"`
	// Notes are what the person applying should know (a configuration
	// without a default queue, an invalid one replaced).
	Notes []string `json:"notes"`
}

// Apply compares the file with the configuration in Consul and, unless
// DryRun or nothing changes, writes it in one check-and-set transaction
// against the configuration it compared with: an apply that raced another
// fails and writes nothing. A stored configuration that is invalid is
// replaced (and said so).
func Apply(ctx context.Context, store queuekv.Store, o ApplyOptions) (*ApplyResult, error) {
	res := &ApplyResult{File: o.Path, SHA256: o.File.SHA256, DryRun: o.DryRun, Changes: []Change{}, Unchanged: []string{},
		Notes: []string{}}
	cur, index, err := store.Read(ctx)
	if testHookAfterRead != nil {
		testHookAfterRead()
	}
	var invalid *queuekv.InvalidError
	switch {
	case errors.As(err, &invalid):
		res.Notes = append(res.Notes, fmt.Sprintf("the configuration in Consul is invalid (%v); this file replaces it", invalid.Err))
	case err != nil:
		return nil, err
	}
	res.Previous = appliedOf(cur, index)
	old := []queuekv.Queue{DefaultQueue} // what a cluster without a configuration has
	if cur != nil {
		old = cur.Queues
	}
	if cur == nil && invalid != nil {
		old = nil
	}
	next := queuekv.Queues(o.File.Config)
	if len(next) == 0 {
		next = []queuekv.Queue{DefaultQueue}
		res.Notes = append(res.Notes, "the file declares no queue: every job is in the default queue (no quota, weight 1)")
	} else if !slices.ContainsFunc(next, func(q queuekv.Queue) bool { return q.Name == policy.DefaultQueue }) {
		res.Notes = append(res.Notes, fmt.Sprintf("no queue %q: submit refuses a job that names no queue; declare queue %q to take such jobs",
			policy.DefaultQueue, policy.DefaultQueue))
	}
	res.Changes, res.Unchanged = Diff(old, next)
	if res.Unchanged == nil {
		res.Unchanged = []string{}
	}
	// The same queues, in the same order, from a valid configuration:
	// nothing to write.
	if cur != nil && slices.Equal(cur.Queues, queuekv.Queues(o.File.Config)) {
		return res, nil
	}
	if cur == nil && invalid == nil && len(o.File.Config.Queues) == 0 {
		return res, nil // no configuration, and the file declares none
	}
	if o.DryRun {
		return res, nil
	}
	rec := &queuekv.Record{Format: queuekv.Format, Queues: queuekv.Queues(o.File.Config), File: o.Path, SHA256: o.File.SHA256,
		AppliedBy: o.AppliedBy, AppliedAt: o.Now.UTC()}
	if rec.Queues == nil {
		rec.Queues = []queuekv.Queue{}
	}
	newIndex, err := store.Write(ctx, rec, index)
	if errors.Is(err, queuekv.ErrConflict) {
		return nil, conflict(ctx, store)
	}
	if err != nil {
		return nil, err
	}
	res.Written, res.Index = true, newIndex
	return res, nil
}

// testHookAfterRead, set by a test, runs between Apply's read and its
// write: another apply racing this one.
var testHookAfterRead func()

// conflict says who applied a configuration while this apply ran.
func conflict(ctx context.Context, store queuekv.Store) error {
	msg := "the queue configuration in Consul changed while this apply ran"
	if r, index, err := store.Read(ctx); err == nil && r != nil {
		msg += " (" + appliedOf(r, index).Line() + ")"
	} else if err == nil {
		msg += " (it was deleted)"
	}
	return fmt.Errorf("%s: nothing was written; run gpujob queue apply again to compare the file with it", msg)
}

// Print writes what an apply did, for people.
func (r *ApplyResult) Print(w io.Writer) {
	fmt.Fprintf(w, "queue file %s (sha256 %s…)\n", r.File, r.SHA256[:min(12, len(r.SHA256))])
	if r.Previous != nil {
		fmt.Fprintf(w, "in Consul: %s\n", r.Previous.Line())
	}
	width := 0
	for _, c := range r.Changes {
		width = max(width, len(c.Queue))
	}
	for _, c := range r.Changes {
		switch c.Action {
		case Added:
			fmt.Fprintf(w, "  + %-*s  %s\n", width, c.Queue, describe(*c.Settings))
		case Changed:
			var parts []string
			for _, f := range c.Fields {
				parts = append(parts, fmt.Sprintf("%s %s → %s", f.Field, f.From, f.To))
			}
			fmt.Fprintf(w, "  ~ %-*s  %s\n", width, c.Queue, strings.Join(parts, "; "))
		case Removed:
			fmt.Fprintf(w, "  - %-*s\n", width, c.Queue)
		}
	}
	if n := len(r.Unchanged); n > 0 {
		fmt.Fprintf(w, "  %d queue(s) unchanged: %s\n", n, strings.Join(r.Unchanged, ", "))
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	switch {
	case r.Written:
		fmt.Fprintf(w, "applied (Consul index %d). Quotas apply to new submissions; running jobs keep running.\n", r.Index)
	case len(r.Changes) == 0:
		fmt.Fprintln(w, "no change: nothing was written")
	case r.DryRun:
		fmt.Fprintln(w, "dry run: nothing was written")
	}
}
