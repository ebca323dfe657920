package servekv

import (
	"encoding/json"
	"fmt"

	"github.com/gpujob/gpujob/internal/contract"
)

// The meta of a service's Nomad job through which the job claims its route:
// `gpujob service deploy` writes both (cli/render's MetaKind and
// cli/command/service's MetaRoute are these names). A route lives in Consul
// KV, where every user of the namespace may write it, so the gateways and
// the autoscaler believe the job a route names only when that job, in
// Nomad, where only the namespace's submitters may write it, claims the
// route back.
const (
	JobMetaKind    = contract.MetaKind
	JobKindService = contract.KindService
	JobMetaRoute   = contract.MetaRoute
)

// JobRoute checks that the Nomad job jobID in namespace jobNS (its meta)
// is the job of the service ns/svc, and returns the route the job claims.
// The error names the rule a job fails, for the logs that say why a route
// is not served or not scaled.
func JobRoute(ns, svc, jobNS, jobID string, meta map[string]string) (*Route, error) {
	if jobNS == "" {
		jobNS = "default"
	}
	if jobNS != ns {
		return nil, fmt.Errorf("job %s is in namespace %s, not the route's %s", jobID, jobNS, ns)
	}
	if meta[JobMetaKind] != JobKindService {
		return nil, fmt.Errorf("job %s/%s is not a gpujob service (its meta %s is %q, not %q)",
			jobNS, jobID, JobMetaKind, meta[JobMetaKind], JobKindService)
	}
	raw, ok := meta[JobMetaRoute]
	if !ok {
		return nil, fmt.Errorf("job %s/%s claims no route (no %s meta; deploy it with gpujob service deploy)", jobNS, jobID, JobMetaRoute)
	}
	var r Route
	if err := json.Unmarshal([]byte(raw), &r); err != nil {
		return nil, fmt.Errorf("job %s/%s: its %s meta: %w", jobNS, jobID, JobMetaRoute, err)
	}
	if r.Namespace != ns || r.Service != svc || r.JobID != jobID {
		return nil, fmt.Errorf("job %s/%s claims the route of %s/%s (job %s), not of %s/%s",
			jobNS, jobID, r.Namespace, r.Service, r.JobID, ns, svc)
	}
	return &r, nil
}
