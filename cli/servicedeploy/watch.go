package servicedeploy

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/nomadapi"
)

// Watch follows the deployment of jobVersion with blocking
// queries until it ends, reporting each change; nil when Nomad made none
// (an unchanged job, or one without an update block).
func Watch(ctx context.Context, nomad nomadapi.API, jobID string, jobVersion uint64, progress func(*api.Deployment)) (*api.Deployment, error) {
	var index uint64
	last := ""
	start := time.Now()
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		q := (&api.QueryOptions{WaitIndex: index, WaitTime: 30 * time.Second}).WithContext(ctx)
		d, meta, err := nomad.LatestDeployment(jobID, q)
		if err != nil {
			return nil, err
		}
		prev := index
		if meta != nil {
			if meta.LastIndex < index {
				index = 0
			} else {
				index = meta.LastIndex
			}
		}
		if index == prev {
			// The query did not block (an index Nomad did not move):
			// do not spin.
			time.Sleep(100 * time.Millisecond)
		}
		if d == nil || d.JobVersion < jobVersion {
			// Nomad creates the deployment with the evaluation: give it
			// a moment, then conclude there is none.
			if time.Since(start) > 10*time.Second {
				return nil, nil
			}
			continue
		}
		if s := DeploymentLine(d); s != last {
			last = s
			progress(d)
		}
		switch d.Status {
		case api.DeploymentStatusRunning, api.DeploymentStatusPending, api.DeploymentStatusPaused,
			api.DeploymentStatusBlocked, api.DeploymentStatusUnblocking:
			continue
		}
		return d, nil
	}
}

// DeploymentLine is one line on a deployment: its status, the replicas of
// the new version placed and healthy, its canaries, and Nomad's words.
func DeploymentLine(d *api.Deployment) string {
	var parts []string
	names := make([]string, 0, len(d.TaskGroups))
	for n := range d.TaskGroups {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		g := d.TaskGroups[n]
		p := fmt.Sprintf("%d/%d healthy", g.HealthyAllocs, g.DesiredTotal)
		if g.UnhealthyAllocs > 0 {
			p += fmt.Sprintf(", %d unhealthy", g.UnhealthyAllocs)
		}
		if g.DesiredCanaries > 0 {
			state := "unpromoted"
			if g.Promoted {
				state = "promoted"
			}
			p += fmt.Sprintf(", canaries %d/%d placed (%s)", len(g.PlacedCanaries), g.DesiredCanaries, state)
		}
		parts = append(parts, p)
	}
	line := fmt.Sprintf("deployment %s (job version %d): %s", gpujobs.ShortID(d.ID), d.JobVersion, d.Status)
	if len(parts) > 0 {
		line += "; " + strings.Join(parts, "; ")
	}
	if d.StatusDescription != "" {
		line += " — " + d.StatusDescription
	}
	return line
}
