package sim

import (
	"fmt"
	"strings"
	"time"
)

// Table prints results side by side, one row per policy.
func Table(results []Result, teams []Team) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-30s %6s %8s %10s %10s %10s %14s  %s\n", "policy", "util", "util-bl", "mean JCT", "p95 JCT", "makespan", "idle-held GPUh", "team share while all wait (weight share)")
	for _, r := range results {
		var shares []string
		for _, t := range teams {
			shares = append(shares, fmt.Sprintf("%s %.2f (%.2f)", t.Name, r.TeamShare[t.Name], r.TeamWeight[t.Name]))
		}
		fmt.Fprintf(&b, "%-30s %5.1f%% %7.1f%% %10s %10s %10s %14.0f  %s\n", r.Policy, 100*r.Utilisation, 100*r.BackloggedUtilisation,
			hours(r.MeanJCT), hours(r.P95JCT), hours(r.Makespan), r.IdleHeldGPUHours, strings.Join(shares, ", "))
	}
	return b.String()
}

func hours(d time.Duration) string { return fmt.Sprintf("%.1fh", d.Hours()) }
