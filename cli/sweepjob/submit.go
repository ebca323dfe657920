package sweepjob

import (
	"context"
	"fmt"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/sweep/controller"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

// InitialState is a new sweep's first state: running, no trial yet.
func InitialState(r *Record, maxTrials int, now time.Time) *controller.State {
	return &controller.State{Namespace: r.Namespace, Sweep: r.Sweep, Status: controller.StatusRunning, MaxTrials: maxTrials,
		Created: now, Updated: now}
}

// Submit records a new sweep (Create: its record and first state, each
// only if absent) and then runs issue, which makes the controller's
// credentials. The credentials come after the record, whose creation is
// create-only, so a concurrent submission of the name never touches the
// winner's; when issue fails, Submit removes the sweep's tree again, so
// that a retry starts clean.
func Submit(ctx context.Context, c *consul.Client, prefix string, r *Record, st *controller.State, issue func() error) error {
	if err := Create(ctx, c, prefix, r, st); err != nil {
		return err
	}
	if err := issue(); err != nil {
		tree := sweepkv.SweepKey(prefix, r.Namespace, r.Sweep) + "/"
		if _, derr := c.KV().DeleteTree(tree, (&consul.WriteOptions{}).WithContext(ctx)); derr != nil {
			return fmt.Errorf("%w; removing the sweep's record %s: %v", err, tree, derr)
		}
		return err
	}
	return nil
}
