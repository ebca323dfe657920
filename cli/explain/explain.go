// Package explain words, for people, why Nomad cannot place a gpujob job
// now: from the plan's placement metrics and the cluster's GPUs.
package explain

import (
	"fmt"
	"sort"
	"strings"

	"github.com/hashicorp/nomad/api"
)

// Node is one ready client as the explanation needs it.
type Node struct {
	Name  string
	Pool  string
	GPUs  int            // healthy nvidia/gpu devices
	Free  int            // healthy and held by no running allocation
	Holds map[string]int // job ID → GPUs it holds on this node

	// What EmptyCapacity needs: where the node is, whether it takes
	// gpujob work at all, and what it could give an allocation when empty.
	Datacenter string
	Ineligible bool
	// DriverProblem is why the node cannot run the gpujob driver ("gpujob
	// driver unhealthy: …"); "" when it can, or when the node does not say.
	DriverProblem string
	CPU           int64    // MHz, less the node's reserved; 0 when not reported
	MemoryMiB     int64    // less the node's reserved; 0 when not reported
	Devices       []Device // healthy nvidia/gpu device groups
}

// Ask is what the job needs.
type Ask struct {
	Workers       int
	GPUsPerWorker int
	NodePool      string
	// For EmptyCapacity: one worker's size and where it may run.
	Datacenters     []string
	CPU             int // MHz
	MemoryMiB       int
	Model           string // GPU model required; "" for any
	MinGPUMemoryMiB int
}

// Placement says why the plan could not place every worker; "" when it
// could. metric is the plan's FailedTGAllocs entry for the group (nil when
// everything was placed).
func Placement(ask Ask, metric *api.AllocationMetric, nodes []Node) string {
	if metric == nil {
		return ""
	}
	failed := metric.CoalescedFailures + 1
	var b strings.Builder
	fmt.Fprintf(&b, "needs %s", need(ask))
	if failed < ask.Workers {
		fmt.Fprintf(&b, "; %d of %d could be placed now, %d cannot", ask.Workers-failed, ask.Workers, failed)
	} else {
		fmt.Fprintf(&b, "; none of them can be placed now")
	}

	var reasons []string
	if len(nodes) == 0 || metric.NodesEvaluated == 0 && metric.NodesInPool == 0 {
		pool := ask.NodePool
		if pool == "" {
			pool = "default"
		}
		reasons = append(reasons, fmt.Sprintf("no ready client node in node pool %q", pool))
	}
	if ask.GPUsPerWorker > 0 {
		if gpuNodes := withGPUs(nodes); len(nodes) > 0 && gpuNodes == 0 {
			reasons = append(reasons, "no node has a healthy nvidia/gpu device (is the device plugin installed?)")
		} else if most := mostGPUs(nodes); most > 0 && most < ask.GPUsPerWorker {
			reasons = append(reasons, fmt.Sprintf("no node holds %d GPUs (the most is %d)", ask.GPUsPerWorker, most))
		} else if s := gpuHolders(nodes); s != "" {
			reasons = append(reasons, s)
		}
	}
	reasons = append(reasons, filtered(metric)...)
	for dim, n := range metric.DimensionExhausted {
		if strings.HasPrefix(dim, "devices") && ask.GPUsPerWorker > 0 {
			continue // said above, with the holders
		}
		reasons = append(reasons, fmt.Sprintf("%d node(s) out of %s", n, dim))
	}
	sort.Strings(reasons[min(len(reasons), 1):])
	for _, r := range reasons {
		b.WriteString("; ")
		b.WriteString(r)
	}
	return b.String()
}

func need(ask Ask) string {
	if ask.GPUsPerWorker == 0 {
		return fmt.Sprintf("%d worker(s), no GPU", ask.Workers)
	}
	return fmt.Sprintf("%d × %d nvidia/gpu (%d GPUs)", ask.Workers, ask.GPUsPerWorker, ask.Workers*ask.GPUsPerWorker)
}

func withGPUs(nodes []Node) int {
	n := 0
	for _, node := range nodes {
		if node.GPUs > 0 {
			n++
		}
	}
	return n
}

func mostGPUs(nodes []Node) int {
	m := 0
	for _, node := range nodes {
		m = max(m, node.GPUs)
	}
	return m
}

// gpuHolders words each GPU node's free GPUs and who holds the rest:
// "node a has 2 of 4 free, 2 held by job bert-a".
func gpuHolders(nodes []Node) string {
	var parts []string
	for _, n := range nodes {
		if n.GPUs == 0 {
			continue
		}
		s := fmt.Sprintf("node %s has %d of %d free", n.Name, n.Free, n.GPUs)
		var holders []string
		for job, k := range n.Holds {
			holders = append(holders, fmt.Sprintf("%d held by job %s", k, job))
		}
		sort.Strings(holders)
		if len(holders) > 0 {
			s += ", " + strings.Join(holders, ", ")
		}
		parts = append(parts, s)
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}

// filtered words the nodes a constraint or class filter ruled out.
func filtered(m *api.AllocationMetric) []string {
	var out []string
	for c, n := range m.ConstraintFiltered {
		out = append(out, fmt.Sprintf("%d node(s) ruled out by constraint %s", n, c))
	}
	for c, n := range m.ClassFiltered {
		out = append(out, fmt.Sprintf("%d node(s) of class %s ruled out", n, c))
	}
	return out
}
