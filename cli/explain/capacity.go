package explain

import (
	"fmt"
	"path"
	"sort"
	"strings"
)

// Device is one node's group of healthy GPUs of one model.
type Device struct {
	Model     string
	MemoryMiB int64 // the group's memory attribute; 0 when unknown
	Healthy   int
}

// Fit is how many workers of an ask one node could hold when empty, and
// what bounds it: "GPUs", "CPU" or "memory", or why the node can hold none
// ("not eligible", "node pool gpu", …).
type Fit struct {
	Node    string
	Workers int
	By      string
}

// Capacity is how many workers of an ask the cluster could hold if nothing
// else ran on it.
type Capacity struct {
	Workers int   // the sum over Nodes; Unbounded when no node says
	Nodes   []Fit // every ready node, those holding most first
}

// Unbounded is the capacity of a node that reports none of the resources
// an ask needs: nothing to refuse on.
const Unbounded = 1 << 30

// EmptyCapacity is an upper bound on the workers of ask the cluster could
// hold when empty: per ready node, what its healthy matching GPUs, its CPU
// and its memory (less what the node reserves) each allow, the least of the
// three, summed. Nodes that are ineligible, lack a healthy gpujob driver, or
// are outside the ask's node pool or datacenters hold none. It leaves out
// what it does not model (disk, ports, other constraints), so it may
// overstate what fits, never understate it: a group above it can never be
// placed, one below it may still queue.
func EmptyCapacity(ask Ask, nodes []Node) Capacity {
	var c Capacity
	for _, n := range nodes {
		f := nodeFit(ask, n)
		c.Nodes = append(c.Nodes, f)
		c.Workers = min(c.Workers+f.Workers, Unbounded)
	}
	sort.SliceStable(c.Nodes, func(i, j int) bool {
		if c.Nodes[i].Workers != c.Nodes[j].Workers {
			return c.Nodes[i].Workers > c.Nodes[j].Workers
		}
		return c.Nodes[i].Node < c.Nodes[j].Node
	})
	return c
}

func nodeFit(ask Ask, n Node) Fit {
	f := Fit{Node: n.Name}
	pool := ask.NodePool
	if pool == "" {
		pool = "default"
	}
	nodePool := n.Pool
	if nodePool == "" {
		nodePool = "default"
	}
	switch {
	case n.Ineligible:
		f.By = "not eligible"
		return f
	case n.DriverProblem != "":
		f.By = n.DriverProblem
		return f
	case pool != "all" && nodePool != pool:
		f.By = "node pool " + nodePool
		return f
	case !inDatacenters(n.Datacenter, ask.Datacenters):
		f.By = "datacenter " + n.Datacenter
		return f
	}
	f.Workers, f.By = Unbounded, ""
	bound := func(have, per int64, by string) {
		if have <= 0 || per <= 0 {
			return // not reported, or not asked for: no bound
		}
		if w := int(min(have/per, Unbounded)); w < f.Workers {
			f.Workers, f.By = w, by
		}
	}
	if ask.GPUsPerWorker > 0 {
		gpus := 0
		for _, d := range n.Devices {
			if d.matches(ask) {
				gpus += d.Healthy
			}
		}
		if gpus == 0 {
			f.Workers, f.By = 0, "no matching GPU"
			if len(n.Devices) == 0 {
				f.By = "no GPU"
			}
			return f
		}
		bound(int64(gpus), int64(ask.GPUsPerWorker), "GPUs")
	}
	bound(n.CPU, int64(ask.CPU), "CPU")
	bound(n.MemoryMiB, int64(ask.MemoryMiB), "memory")
	return f
}

func (d Device) matches(ask Ask) bool {
	if ask.Model != "" && d.Model != ask.Model {
		return false
	}
	// An unknown memory size does not rule the group out.
	return ask.MinGPUMemoryMiB <= 0 || d.MemoryMiB <= 0 || d.MemoryMiB >= int64(ask.MinGPUMemoryMiB)
}

// inDatacenters reports whether dc matches one of the patterns (Nomad's
// datacenters take * wildcards); no patterns means any.
func inDatacenters(dc string, patterns []string) bool {
	if len(patterns) == 0 {
		return true
	}
	for _, p := range patterns {
		// A pattern path.Match cannot read counts as a match: the
		// estimate errs on the side of letting Nomad decide.
		if ok, err := path.Match(p, dc); ok || err != nil {
			return true
		}
	}
	return false
}

// maxListed bounds the nodes String names.
const maxListed = 8

// String words the capacity per node: "3 nodes: gpu-1 2 (GPUs), gpu-2 1
// (memory), cpu-1 0 (no GPU)".
func (c Capacity) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d ready node(s)", len(c.Nodes))
	for i, f := range c.Nodes {
		if i == maxListed {
			fmt.Fprintf(&b, ", and %d more", len(c.Nodes)-maxListed)
			break
		}
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString(", ")
		}
		if f.Workers >= Unbounded {
			fmt.Fprintf(&b, "%s any number", f.Node)
			continue
		}
		fmt.Fprintf(&b, "%s %d (%s)", f.Node, f.Workers, f.By)
	}
	return b.String()
}
