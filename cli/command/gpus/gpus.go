// Package gpus is `gpujob gpus`: every GPU of the cluster with its health,
// utilisation, memory, temperature, power and the allocation holding it.
package gpus

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	"github.com/hashicorp/nomad/api"
	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/cmdutil"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/observe"
	"github.com/gpujob/gpujob/internal/contract"
)

// Report is what `gpujob gpus --json` prints.
type Report struct {
	GPUs   []GPU   `json:"gpus"`
	Totals []Total `json:"totals"`
	// Warnings are what could not be read (a node's stats), not fatal.
	Warnings []string `json:"warnings"`

	free map[string]int // healthy and unheld GPUs by model, for the table
}

// GPU is one device instance of a node.
type GPU struct {
	Node       string `json:"node"`
	NodeID     string `json:"node_id"`
	NodeStatus string `json:"node_status"` // ready, down, …
	ID         string `json:"id"`          // the UUID (GPU-… or MIG-…)
	Vendor     string `json:"vendor"`
	Model      string `json:"model"`
	MemoryMiB  *int64 `json:"memory_mib"` // the device group's memory attribute
	Fake       bool   `json:"fake"`       // a fake GPU of the gpujob device plugin
	Healthy    bool   `json:"healthy"`
	// HealthDescription is why the device is unhealthy (it may be set
	// when healthy too).
	HealthDescription string `json:"health_description,omitempty"`
	// The stats are null when the device could not give them ("N/A") or
	// the node's stats could not be read.
	UtilizationPct *float64 `json:"utilization_pct"`
	MemoryUsedMiB  *float64 `json:"memory_used_mib"`
	MemoryTotalMiB *float64 `json:"memory_total_mib"`
	TemperatureC   *float64 `json:"temperature_c"`
	PowerW         *float64 `json:"power_w"`
	PowerLimitW    *float64 `json:"power_limit_w"`
	// Holder is the non-terminal allocation the device is reserved to, or
	// null.
	Holder *Holder `json:"holder"`

	stats map[string]*api.StatValue // for the table: N/A versus unknown
}

// Holder is an allocation holding a GPU.
type Holder struct {
	AllocID   string `json:"alloc_id"`
	AllocName string `json:"alloc_name"`
	JobID     string `json:"job_id"`
	Namespace string `json:"namespace"`
	Task      string `json:"task"`
}

// Total sums a model's GPUs across the cluster.
type Total struct {
	Model   string `json:"model"`
	Count   int    `json:"count"`
	Healthy int    `json:"healthy"`
	InUse   int    `json:"in_use"`
	Fake    int    `json:"fake"`
}

// Options is what the command's flags ask for.
type Options struct {
	JSON bool
}

// NewCmd returns the gpus command.
func NewCmd(f *factory.Factory) *cobra.Command { return NewCmdWith(f, nil) }

// NewCmdWith is NewCmd running runF instead of the command when runF is not
// nil: a test checks the Options the arguments parse into without running.
func NewCmdWith(f *factory.Factory, runF func(context.Context, *Options) error) *cobra.Command {
	o := &Options{}
	cmd := &cobra.Command{
		Use:   "gpus",
		Short: "List the cluster's GPUs, their health and use, and who holds them",
		Long: `Gpus lists every GPU the Nomad clients fingerprinted, one row per device: the
node, the model, its memory, its health (and why it is unhealthy), utilisation,
memory used, temperature and power from the device plugin's stats, and the
allocation holding it. Then the totals per model: how many, how many healthy,
how many in use. Fake GPUs (the device plugin's fake backend) are marked.
A value the device cannot give reads N/A; "-" means unknown (no stats from
that node).`,
		Example: `  gpujob gpus
  gpujob gpus --json | jq '.gpus[] | select(.holder == null and .healthy) | .id'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return cmdutil.Run(cmd.Context(), o, runF, func(ctx context.Context) error { return run(ctx, f, o) })
		},
	}
	cmd.Flags().BoolVar(&o.JSON, "json", false, "print JSON")
	return cmd
}

func run(ctx context.Context, f *factory.Factory, o *Options) error {
	nomad, err := f.Nomad()
	if err != nil {
		return err
	}
	snap, err := observe.Once(ctx, observe.Config{Nomad: nomad})
	if err != nil {
		return err
	}
	r := FromSnapshot(snap)
	if o.JSON {
		return gpujobs.PrintJSON(f.IO.Out, r)
	}
	return printReport(f.IO.Out, f.IO.ErrOut, r)
}

// FromSnapshot is the report of a snapshot of the cluster: its GPUs, by
// node, model and UUID, with the holders and per-model counts the
// snapshot has (the inventory `top` and the exporter show too, so they
// agree on who holds a GPU and how many are free).
func FromSnapshot(s *observe.Snapshot) *Report {
	r := &Report{GPUs: []GPU{}, Totals: []Total{}, Warnings: []string{}, free: map[string]int{}}
	for _, n := range s.Nodes {
		switch {
		case n.Status != "ready":
			r.Warnings = append(r.Warnings, fmt.Sprintf("node %s is %s: no GPU stats", n.Name, n.Status))
		case n.StatsErr != "":
			r.Warnings = append(r.Warnings, fmt.Sprintf("node %s: %s", n.Name, n.StatsErr))
		}
		for _, g := range n.GPUs {
			gpu := GPU{Node: n.Name, NodeID: n.ID, NodeStatus: n.Status, ID: g.UUID, Vendor: g.Vendor, Model: g.Model,
				MemoryMiB: g.MemoryMiB, Fake: g.Fake, Healthy: g.Healthy, HealthDescription: g.HealthDescription,
				UtilizationPct: g.UtilPct, MemoryUsedMiB: g.MemUsedMiB, MemoryTotalMiB: g.MemTotalMiB,
				TemperatureC: g.TempC, PowerW: g.PowerW, PowerLimitW: g.PowerLimitW, stats: g.Stats}
			if h := g.Holder; h != nil {
				gpu.Holder = &Holder{AllocID: h.AllocID, AllocName: h.AllocName, JobID: h.JobID, Namespace: h.Namespace, Task: h.Task}
			}
			r.GPUs = append(r.GPUs, gpu)
		}
	}
	sort.SliceStable(r.GPUs, func(i, j int) bool {
		a, b := r.GPUs[i], r.GPUs[j]
		if a.Node != b.Node {
			return a.Node < b.Node
		}
		if a.Model != b.Model {
			return a.Model < b.Model
		}
		return a.ID < b.ID
	})
	for _, t := range s.Totals() {
		r.Totals = append(r.Totals, Total{Model: t.Model, Count: t.Count, Healthy: t.Healthy, InUse: t.InUse, Fake: t.Fake})
		r.free[t.Model] = t.Free
	}
	return r
}

func printReport(w, errw io.Writer, r *Report) error {
	for _, warn := range r.Warnings {
		fmt.Fprintf(errw, "warning: %s\n", warn)
	}
	if len(r.GPUs) == 0 {
		fmt.Fprintln(w, "No GPUs: no Nomad client fingerprinted a GPU (is the gpujob device plugin installed and configured?).")
		return nil
	}
	var notes []string
	t := gpujobs.NewTable(w, "NODE", "MODEL", "GPU", "MEMORY", "HEALTH", "UTIL", "MEM USED", "TEMP", "POWER", "HELD BY")
	for _, g := range r.GPUs {
		node := g.Node
		if g.NodeStatus != "" && g.NodeStatus != "ready" {
			node += " (" + g.NodeStatus + ")"
		}
		model := g.Model
		if g.Fake {
			model += " (fake)"
		}
		mem := "-"
		if g.MemoryMiB != nil {
			mem = fmt.Sprintf("%d MiB", *g.MemoryMiB)
		}
		health := "healthy"
		if !g.Healthy {
			health = "unhealthy"
			if g.HealthDescription != "" {
				// the reason goes below the table, which it would widen
				notes = append(notes, fmt.Sprintf("[%d] %s %s: %s", len(notes)+1, g.Node, g.ID, g.HealthDescription))
				health += fmt.Sprintf(" [%d]", len(notes))
			}
		}
		held := "free"
		if g.Holder != nil {
			held = fmt.Sprintf("%s (%s)", g.Holder.AllocName, gpujobs.ShortID(g.Holder.AllocID))
		}
		t.Row(node, model, gpujobs.ShortUUID(g.ID), mem, health,
			statText(g.stats, contract.StatGPUUtil, g.UtilizationPct, nil, "%"),
			statText(g.stats, contract.StatMemory, g.MemoryUsedMiB, g.MemoryTotalMiB, " MiB"),
			statText(g.stats, contract.StatTemperature, g.TemperatureC, nil, " C"),
			statText(g.stats, contract.StatPower, g.PowerW, g.PowerLimitW, " W"),
			held)
	}
	if err := t.Flush(); err != nil {
		return err
	}
	for _, n := range notes {
		fmt.Fprintln(w, n)
	}
	fmt.Fprintln(w)
	tt := gpujobs.NewTable(w, "MODEL", "GPUS", "HEALTHY", "IN USE", "FREE")
	for _, to := range r.Totals {
		model := to.Model
		if to.Fake == to.Count {
			model += " (fake)"
		}
		tt.Row(model, strconv.Itoa(to.Count), strconv.Itoa(to.Healthy), strconv.Itoa(to.InUse), strconv.Itoa(r.free[to.Model]))
	}
	return tt.Flush()
}

// statText is "87%", "1024/15360 MiB", "N/A" (the device cannot give it) or
// "-" (no stats).
func statText(stats map[string]*api.StatValue, name string, num, den *float64, unit string) string {
	v := stats[name]
	switch {
	case v == nil:
		return "-"
	case num == nil && v.StringVal != nil:
		return *v.StringVal
	case num == nil:
		return "-"
	case den != nil:
		return fmtNum(*num) + "/" + fmtNum(*den) + unit
	}
	return fmtNum(*num) + unit
}

func fmtNum(f float64) string {
	s := strconv.FormatFloat(f, 'f', 1, 64)
	return strings.TrimSuffix(s, ".0")
}
