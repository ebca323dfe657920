package nomadapi

import (
	"fmt"

	"github.com/hashicorp/nomad/api"
)

// ScaleGroup sets the group's count as a new version of the job.
func (f *Fake) ScaleGroup(jobID, group string, count int, message string) (*api.JobRegisterResponse, error) {
	f.mu.Lock()
	if err := f.errLocked("ScaleGroup"); err != nil {
		f.mu.Unlock()
		return nil, err
	}
	old, ok := f.jobs[jobID]
	f.mu.Unlock()
	if !ok {
		return nil, notFound("scaling "+jobID+"/"+group, "job not found")
	}
	j := clone(old)
	for _, g := range j.TaskGroups {
		if g.Name != nil && *g.Name == group {
			g.Count = &count
			return f.Register(j)
		}
	}
	return nil, fmt.Errorf("scaling %s/%s: Unexpected response code: 400 (task group %q specified for scaling does not exist in job)", jobID, group, group)
}

// SetDeployment makes d the job's latest deployment.
func (f *Fake) SetDeployment(jobID string, d *api.Deployment) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.deployments == nil {
		f.deployments = map[string]*api.Deployment{}
	}
	f.deployments[jobID] = d
	f.bumpLocked()
}

func (f *Fake) LatestDeployment(jobID string, q *api.QueryOptions) (*api.Deployment, *api.QueryMeta, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.errLocked("LatestDeployment"); err != nil {
		return nil, nil, err
	}
	return clone(f.deployments[jobID]), &api.QueryMeta{LastIndex: f.index}, nil
}

func (f *Fake) JobVersions(jobID string) ([]*api.Job, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.errLocked("JobVersions"); err != nil {
		return nil, err
	}
	h := f.history[jobID]
	if len(h) == 0 {
		return nil, notFound("reading the versions of "+jobID, "job versions not found")
	}
	out := make([]*api.Job, 0, len(h))
	for i := len(h) - 1; i >= 0; i-- {
		out = append(out, clone(h[i]))
	}
	return out, nil
}

// Revert registers the given version again, as a new version.
func (f *Fake) Revert(jobID string, version uint64) (*api.JobRegisterResponse, error) {
	f.mu.Lock()
	if err := f.errLocked("Revert"); err != nil {
		f.mu.Unlock()
		return nil, err
	}
	var found *api.Job
	for _, j := range f.history[jobID] {
		if j.Version != nil && *j.Version == version {
			found = clone(j)
		}
	}
	f.mu.Unlock()
	if found == nil {
		return nil, notFound("reverting "+jobID, fmt.Sprintf("job %s has no version %d", jobID, version))
	}
	found.Version = nil
	return f.Register(found)
}
