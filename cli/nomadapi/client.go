package nomadapi

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/hashicorp/nomad/api"
)

// Options are the connection settings; empty fields take the nomad CLI's
// environment variables (NOMAD_ADDR, NOMAD_TOKEN, NOMAD_NAMESPACE,
// NOMAD_REGION, NOMAD_CACERT, NOMAD_CLIENT_CERT, NOMAD_CLIENT_KEY,
// NOMAD_TLS_SERVER_NAME, NOMAD_SKIP_VERIFY), as `nomad` does.
type Options struct {
	Address    string
	Token      string
	Namespace  string
	Region     string
	CACert     string
	ClientCert string
	ClientKey  string
}

// client is API over the real Nomad client.
type client struct {
	c *api.Client
}

// New connects to Nomad (no request is made until a command needs one).
func New(o Options) (API, error) {
	cfg := api.DefaultConfig() // reads the NOMAD_* environment
	if o.Address != "" {
		cfg.Address = o.Address
	}
	if o.Token != "" {
		cfg.SecretID = o.Token
	}
	if o.Namespace != "" {
		cfg.Namespace = o.Namespace
	}
	if o.Region != "" {
		cfg.Region = o.Region
	}
	if o.CACert != "" {
		cfg.TLSConfig.CACert = o.CACert
	}
	if o.ClientCert != "" {
		cfg.TLSConfig.ClientCert = o.ClientCert
	}
	if o.ClientKey != "" {
		cfg.TLSConfig.ClientKey = o.ClientKey
	}
	c, err := api.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("nomad client for %s: %w", cfg.Address, err)
	}
	return &client{c: c}, nil
}

func (c *client) Address() string { return c.c.Address() }

// explain turns transport and ACL failures into what to check.
func (c *client) explain(what string, err error) error {
	if err == nil {
		return nil
	}
	var ne net.Error
	var ue *url.Error
	msg := err.Error()
	switch {
	case errors.As(err, &ue) || errors.As(err, &ne) || strings.Contains(msg, "connection refused"):
		return fmt.Errorf("%s: cannot reach Nomad at %s (is the agent running? set NOMAD_ADDR or --address): %w", what, c.Address(), err)
	case strings.Contains(msg, "403") || strings.Contains(strings.ToLower(msg), "permission denied"):
		return fmt.Errorf("%s: Nomad at %s refused the request: check NOMAD_TOKEN (or --token) and its ACL policy: %w", what, c.Address(), err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

func (c *client) ParseHCL(jobHCL, vars string) (*api.Job, error) {
	job, err := c.c.Jobs().ParseHCLOpts(&api.JobsParseRequest{JobHCL: jobHCL, Variables: vars, Canonicalize: true})
	return job, c.explain("parsing the jobspec", err)
}

func (c *client) Validate(job *api.Job) (*api.JobValidateResponse, error) {
	r, _, err := c.c.Jobs().Validate(job, nil)
	return r, c.explain("validating the job", err)
}

func (c *client) Plan(job *api.Job) (*api.JobPlanResponse, error) {
	r, _, err := c.c.Jobs().Plan(job, true, nil)
	return r, c.explain("planning the job", err)
}

func (c *client) Register(job *api.Job) (*api.JobRegisterResponse, error) {
	r, _, err := c.c.Jobs().Register(job, nil)
	return r, c.explain("registering the job", err)
}

func (c *client) Deregister(jobID string, purge bool) (string, error) {
	id, _, err := c.c.Jobs().Deregister(jobID, purge, nil)
	return id, c.explain("stopping job "+jobID, err)
}

func (c *client) Job(jobID string) (*api.Job, error) {
	j, _, err := c.c.Jobs().Info(jobID, nil)
	return j, c.explain("reading job "+jobID, err)
}

func (c *client) Jobs(q *api.QueryOptions) ([]*api.JobListStub, *api.QueryMeta, error) {
	j, m, err := c.c.Jobs().List(q)
	return j, m, c.explain("listing jobs", err)
}

func (c *client) JobSummary(jobID string) (*api.JobSummary, error) {
	s, _, err := c.c.Jobs().Summary(jobID, nil)
	return s, c.explain("reading the summary of job "+jobID, err)
}

func (c *client) JobAllocations(jobID string, q *api.QueryOptions) ([]*api.AllocationListStub, *api.QueryMeta, error) {
	a, m, err := c.c.Jobs().Allocations(jobID, true, q)
	return a, m, c.explain("listing the allocations of job "+jobID, err)
}

func (c *client) Evaluation(evalID string, q *api.QueryOptions) (*api.Evaluation, *api.QueryMeta, error) {
	e, m, err := c.c.Evaluations().Info(evalID, q)
	return e, m, c.explain("reading evaluation "+evalID, err)
}

func (c *client) Allocation(allocID string) (*api.Allocation, error) {
	a, _, err := c.c.Allocations().Info(allocID, nil)
	return a, c.explain("reading allocation "+allocID, err)
}

func (c *client) Logs(alloc *api.Allocation, task, stream string, follow bool, cancel <-chan struct{}) (<-chan *api.StreamFrame, <-chan error) {
	return c.c.AllocFS().Logs(alloc, follow, task, stream, api.OriginStart, 0, cancel, nil)
}

func (c *client) Nodes(q *api.QueryOptions) ([]*api.NodeListStub, *api.QueryMeta, error) {
	n, m, err := c.c.Nodes().List(q)
	return n, m, c.explain("listing nodes", err)
}

func (c *client) Node(nodeID string) (*api.Node, error) {
	n, _, err := c.c.Nodes().Info(nodeID, nil)
	return n, c.explain("reading node "+nodeID, err)
}

func (c *client) NodeAllocations(nodeID string) ([]*api.Allocation, error) {
	a, _, err := c.c.Nodes().Allocations(nodeID, nil)
	return a, c.explain("listing the allocations of node "+nodeID, err)
}

func (c *client) NodeStats(nodeID string) (*api.HostStats, error) {
	s, err := c.c.Nodes().Stats(nodeID, nil)
	return s, c.explain("reading the stats of node "+nodeID, err)
}
