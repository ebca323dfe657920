package queues

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/gpujob/gpujob/cli/explain"
	"github.com/gpujob/gpujob/internal/queue/policy"
	"github.com/gpujob/gpujob/internal/queue/queuekv"
)

// readTimeout bounds submit's read of the configuration: a Consul that
// does not answer must not hang a submit.
const readTimeout = 10 * time.Second

// CheckSubmit is submit's check of job against the queue configuration in
// Consul, before anything is registered: it refuses a job whose queue does
// not exist (naming the queues), and one its queue could never hold — a
// gang larger than the whole cluster, than its queue's quota with
// borrowing off, or than its cohort's quota (policy.CheckAdmissible, with
// the numbers). nodes are the cluster's nodes as submit read them
// (observe.ClusterGPUs).
//
// Without a configuration a job that names no queue, or the default
// queue, passes unchecked: submit works as it did before queues. When the
// configuration cannot be read (no Consul reachable, an ACL token that may
// not read it) such a job passes too, with a warning on warn; a job that
// names another queue is refused, since its queue cannot be checked. A
// stored configuration that is invalid refuses every job.
func CheckSubmit(ctx context.Context, open func() (queuekv.Store, error), job policy.Job, nodes []explain.Node, warn io.Writer) error {
	_, err := CheckSubmitMode(ctx, open, job, nodes, warn)
	return err
}

// CheckSubmitMode is CheckSubmit saying too whether the cluster is in
// queue mode: a queue configuration exists (gpujob queue apply wrote it),
// so a job that passes goes into the queue (Records.Enqueue) and the
// admission controller registers it. Without a configuration, or when it
// cannot be read (the job passes with a warning), a job is registered
// directly, as before queues. It reads the configuration once.
func CheckSubmitMode(ctx context.Context, open func() (queuekv.Store, error), job policy.Job, nodes []explain.Node, warn io.Writer) (queued bool, err error) {
	named := job.Queue != "" && job.Queue != policy.DefaultQueue
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	var r *queuekv.Record
	store, err := open()
	if err == nil {
		r, _, err = store.Read(ctx)
	}
	var invalid *queuekv.InvalidError
	switch {
	case errors.As(err, &invalid):
		return false, err
	case err != nil && named:
		return false, fmt.Errorf("queue %s cannot be checked: the queue configuration could not be read: %w", job.Queue, err)
	case err != nil:
		fmt.Fprintf(warn, "warning: the queue configuration could not be read (%v): the job goes to the default queue unchecked, registered directly\n", err)
		return false, nil
	case r == nil && !named:
		return false, nil
	}
	err = policy.CheckAdmissible(r.Config(), Nodes(nodes), job)
	var unknown *policy.UnknownQueueError
	if errors.As(err, &unknown) && job.Queue == "" {
		return false, fmt.Errorf("job %s names no queue, and the queue configuration has no queue %q for such jobs: name one of its queues (queue = \"NAME\" in the spec, or --queue): %s",
			job.ID, policy.DefaultQueue, strings.Join(unknown.Queues, ", "))
	}
	return err == nil && r != nil, err
}

// Nodes is the cluster as CheckAdmissible counts it: every ready node that
// takes gpujob work (eligible, with a healthy gpujob driver), with its
// healthy GPUs, CPU and memory less what the node reserves, empty — what
// explain.EmptyCapacity counts too, without a job's node pool,
// datacenters or GPU model (queues span the cluster; submit's capacity
// check refuses those before this one). A node that reports no CPU or
// memory is not limited by it.
func Nodes(nodes []explain.Node) []policy.Node {
	const unreported = 1 << 30
	out := make([]policy.Node, 0, len(nodes))
	for _, n := range nodes {
		if n.Ineligible || n.DriverProblem != "" {
			continue
		}
		c := policy.Resources{GPUs: n.GPUs, CPUMHz: int(min(n.CPU, unreported)), MemoryMB: int(min(n.MemoryMiB, unreported))}
		if n.CPU <= 0 {
			c.CPUMHz = unreported
		}
		if n.MemoryMiB <= 0 {
			c.MemoryMB = unreported
		}
		out = append(out, policy.Node{Name: n.Name, Capacity: c})
	}
	return out
}
