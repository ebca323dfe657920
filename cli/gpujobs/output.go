package gpujobs

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// PrintJSON writes v as indented JSON and a newline.
func PrintJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// Table is a tabwriter for the commands' tables: write rows with Row, then
// Flush.
type Table struct {
	tw *tabwriter.Writer
}

// NewTable starts a table with a header row.
func NewTable(w io.Writer, header ...string) *Table {
	t := &Table{tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)}
	t.Row(header...)
	return t
}

// Row writes one row; an empty cell shows as "-".
func (t *Table) Row(cells ...string) {
	for i, c := range cells {
		if c == "" {
			cells[i] = "-"
		}
		// a tab or newline inside a cell would break the columns
		cells[i] = strings.NewReplacer("\t", " ", "\n", " ").Replace(cells[i])
	}
	fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
}

// Flush writes the table out.
func (t *Table) Flush() error { return t.tw.Flush() }

// ShortID is the first 8 characters of an ID, as `nomad` shows them.
func ShortID(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

// ShortUUID shortens a GPU or MIG UUID to its kind and first 8 hex digits:
// "GPU-5b8a1c3e-…" → "GPU-5b8a1c3e".
func ShortUUID(id string) string {
	kind, rest, ok := strings.Cut(id, "-")
	if !ok || len(rest) <= 8 {
		return id
	}
	return kind + "-" + rest[:8]
}

// Ago is how long before now t was, in the largest whole unit: "just now",
// "45s ago", "12m ago", "3h ago", "2d ago".
func Ago(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	switch {
	case d < time.Second:
		return "just now"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d/time.Hour))
	default:
		return fmt.Sprintf("%dd ago", int(d/(24*time.Hour)))
	}
}

// Counts is a job's members by state.
type Counts struct {
	Pending  int `json:"pending"`
	Running  int `json:"running"`
	Complete int `json:"complete"`
	Failed   int `json:"failed"`
	Lost     int `json:"lost"`
}

// Add counts one member in state (see ClientState).
func (c *Counts) Add(state string) {
	switch state {
	case "pending":
		c.Pending++
	case "running":
		c.Running++
	case "complete":
		c.Complete++
	case "failed":
		c.Failed++
	case "lost":
		c.Lost++
	}
}

// Text is "2 running, 1 complete, 1 failed", leaving out zeros ("no
// allocations" when all are).
func (c Counts) Text() string {
	var parts []string
	for _, p := range []struct {
		n    int
		word string
	}{{c.Pending, "pending"}, {c.Running, "running"}, {c.Complete, "complete"}, {c.Failed, "failed"}, {c.Lost, "lost"}} {
		if p.n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", p.n, p.word))
		}
	}
	if len(parts) == 0 {
		return "no allocations"
	}
	return strings.Join(parts, ", ")
}

// JobState is a training job's state as gpujob shows it: "stopped" when
// the job was stopped; "running" while a member runs; "complete" when all
// workers completed; "failed" when a member failed or was lost and none
// runs; "pending" otherwise (queued, placing, or between rounds).
func JobState(stopped bool, c Counts, workers int) string {
	switch {
	case stopped:
		return "stopped"
	case c.Running > 0:
		return "running"
	case c.Pending > 0:
		return "pending"
	case c.Failed > 0 || c.Lost > 0:
		return "failed"
	case c.Complete > 0 && (workers <= 0 || c.Complete >= workers):
		return "complete"
	}
	return "pending"
}
