package nomadapi

import (
	"github.com/hashicorp/nomad/api"
)

func (c *client) ScaleGroup(jobID, group string, count int, message string) (*api.JobRegisterResponse, error) {
	r, _, err := c.c.Jobs().Scale(jobID, group, &count, message, false, nil, nil)
	return r, c.explain("scaling "+jobID+"/"+group, c.ns(CapScaleJob), err)
}

func (c *client) LatestDeployment(jobID string, q *api.QueryOptions) (*api.Deployment, *api.QueryMeta, error) {
	d, m, err := c.c.Jobs().LatestDeployment(jobID, q)
	return d, m, c.explain("reading the deployment of "+jobID, c.ns(CapReadJob), err)
}

func (c *client) JobVersions(jobID string) ([]*api.Job, error) {
	v, _, _, err := c.c.Jobs().Versions(jobID, false, nil)
	return v, c.explain("reading the versions of "+jobID, c.ns(CapReadJob), err)
}

func (c *client) Revert(jobID string, version uint64) (*api.JobRegisterResponse, error) {
	r, _, err := c.c.Jobs().Revert(jobID, version, nil, nil, "", "")
	return r, c.explain("reverting "+jobID, c.ns(CapSubmitJob), err)
}
