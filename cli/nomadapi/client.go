package nomadapi

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

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
	// Socket, when set, is the path of a task's Task API socket
	// (${NOMAD_SECRETS_DIR}/api.sock): the requests go there, to the local
	// client agent, which needs no TLS of the task (Address is ignored).
	Socket string
}

// client is API over the real Nomad client.
type client struct {
	c *api.Client
	// namespace and tokenSet describe the requests, for PermissionError.
	namespace string
	tokenSet  bool
	// socket is Options.Socket, which Address names.
	socket string
}

// New connects to Nomad (no request is made until a command needs one).
func New(o Options) (API, error) {
	c, cfg, err := newClient(o)
	if err != nil {
		return nil, err
	}
	ns := cfg.Namespace
	if ns == "" {
		ns = "default"
	}
	return &client{c: c, namespace: ns, tokenSet: cfg.SecretID != "", socket: o.Socket}, nil
}

// NewRaw is the Nomad API client New wraps, for a library that takes one
// (the queue controller's internal/queue/nomadseam): the same settings,
// the same environment, the Task API socket.
func NewRaw(o Options) (*api.Client, error) {
	c, _, err := newClient(o)
	return c, err
}

func newClient(o Options) (*api.Client, *api.Config, error) {
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
	if o.Socket != "" {
		// The host part is never dialled; the Task API speaks plain HTTP.
		cfg.Address = "http://task-api"
		cfg.TLSConfig = &api.TLSConfig{}
		sock := o.Socket
		cfg.HttpClient = &http.Client{Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", sock)
			},
		}}
	}
	c, err := api.NewClient(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("nomad client for %s: %w", cfg.Address, err)
	}
	return c, cfg, nil
}

func (c *client) Address() string {
	if c.socket != "" {
		return "unix://" + c.socket
	}
	return c.c.Address()
}

// explain turns transport and ACL failures into what to check; need is the
// ACL rule the request needs, named when Nomad refuses it.
func (c *client) explain(what string, need Need, err error) error {
	if err == nil {
		return nil
	}
	if pe := c.permissionError(what, need, err); pe != nil {
		return pe
	}
	if tlsProblem(err) {
		return fmt.Errorf("%s: TLS with Nomad at %s failed (check NOMAD_ADDR's scheme, NOMAD_CACERT for the CA that "+
			"signed the agent's certificate, and NOMAD_CLIENT_CERT and NOMAD_CLIENT_KEY where the agent asks for a client certificate): %w",
			what, c.Address(), err)
	}
	var ne net.Error
	var ue *url.Error
	if errors.As(err, &ue) || errors.As(err, &ne) || strings.Contains(err.Error(), "connection refused") {
		return fmt.Errorf("%s: cannot reach Nomad at %s (is the agent running? set NOMAD_ADDR or --address): %w", what, c.Address(), err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// permissionError is the package's permissionError, with a refused token
// diagnosed (PermissionError.diagnose): one more request, on failure only.
func (c *client) permissionError(what string, need Need, err error) *PermissionError {
	pe := permissionError(what, need, c.Address(), c.tokenSet, err)
	if pe != nil && pe.TokenSet && pe.Problem == TokenDenied {
		pe.diagnose(func() (*api.ACLToken, error) {
			tok, _, err := c.c.ACLTokens().Self(nil)
			return tok, err
		}, time.Now())
	}
	return pe
}

// tlsProblem reports whether err is a failed TLS handshake: a certificate
// the client does not trust, a client certificate the agent refused or did
// not get, or one side speaking TLS to the other's plain HTTP.
func tlsProblem(err error) bool {
	var verify *tls.CertificateVerificationError
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	var header tls.RecordHeaderError
	if errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &host) || errors.As(err, &invalid) || errors.As(err, &header) {
		return true
	}
	// The agent's alerts (a missing or refused client certificate), and
	// HTTP spoken to HTTPS or the other way round, have no exported type.
	msg := err.Error()
	return strings.Contains(msg, "remote error: tls: ") || strings.Contains(msg, "server gave HTTP response to HTTPS client") ||
		strings.Contains(msg, "Client sent an HTTP request to an HTTPS server")
}

// ns is a namespace capability in the client's namespace; nodeRead is the
// node policy the node endpoints need.
func (c *client) ns(capability string) Need {
	return Need{Namespace: c.namespace, Capability: capability}
}

var nodeRead = Need{Node: "read"}

func (c *client) ParseHCL(jobHCL, vars string) (*api.Job, error) {
	job, err := c.c.Jobs().ParseHCLOpts(&api.JobsParseRequest{JobHCL: jobHCL, Variables: vars, Canonicalize: true})
	return job, c.explain("parsing the jobspec", c.ns(CapSubmitJob), err)
}

func (c *client) Validate(job *api.Job) (*api.JobValidateResponse, error) {
	r, _, err := c.c.Jobs().Validate(job, nil)
	return r, c.explain("validating the job", c.ns(CapReadJob), err)
}

func (c *client) Plan(job *api.Job) (*api.JobPlanResponse, error) {
	r, _, err := c.c.Jobs().Plan(job, true, nil)
	return r, c.explain("planning the job", c.ns(CapSubmitJob), err)
}

func (c *client) Register(job *api.Job) (*api.JobRegisterResponse, error) {
	r, _, err := c.c.Jobs().Register(job, nil)
	return r, c.explain("registering the job", c.ns(CapSubmitJob), err)
}

func (c *client) RegisterNew(job *api.Job) (*api.JobRegisterResponse, error) {
	r, _, err := c.c.Jobs().EnforceRegister(job, 0, nil)
	// Nomad answers a failed index check with a 500 whose text names it.
	if err != nil && strings.Contains(err.Error(), "job modify index") {
		id := ""
		if job.ID != nil {
			id = *job.ID
		}
		return nil, fmt.Errorf("registering job %s: %w", id, ErrJobExists)
	}
	return r, c.explain("registering the job", c.ns(CapSubmitJob), err)
}

func (c *client) Deregister(jobID string, purge bool) (string, error) {
	id, _, err := c.c.Jobs().Deregister(jobID, purge, nil)
	return id, c.explain("stopping job "+jobID, c.ns(CapSubmitJob), err)
}

func (c *client) Job(jobID string) (*api.Job, error) {
	j, _, err := c.c.Jobs().Info(jobID, nil)
	return j, c.explain("reading job "+jobID, c.ns(CapReadJob), err)
}

func (c *client) Jobs(q *api.QueryOptions) ([]*api.JobListStub, *api.QueryMeta, error) {
	j, m, err := c.c.Jobs().List(q)
	return j, m, c.explain("listing jobs", c.ns(CapListJobs), err)
}

func (c *client) JobSummary(jobID string) (*api.JobSummary, error) {
	s, _, err := c.c.Jobs().Summary(jobID, nil)
	return s, c.explain("reading the summary of job "+jobID, c.ns(CapReadJob), err)
}

func (c *client) JobAllocations(jobID string, q *api.QueryOptions) ([]*api.AllocationListStub, *api.QueryMeta, error) {
	a, m, err := c.c.Jobs().Allocations(jobID, true, q)
	return a, m, c.explain("listing the allocations of job "+jobID, c.ns(CapReadJob), err)
}

func (c *client) Evaluation(evalID string, q *api.QueryOptions) (*api.Evaluation, *api.QueryMeta, error) {
	e, m, err := c.c.Evaluations().Info(evalID, q)
	return e, m, c.explain("reading evaluation "+evalID, c.ns(CapReadJob), err)
}

func (c *client) Allocation(allocID string) (*api.Allocation, error) {
	a, _, err := c.c.Allocations().Info(allocID, nil)
	return a, c.explain("reading allocation "+allocID, c.ns(CapReadJob), err)
}

func (c *client) Allocations(q *api.QueryOptions) ([]*api.AllocationListStub, *api.QueryMeta, error) {
	a, m, err := c.c.Allocations().List(q)
	return a, m, c.explain("listing allocations", c.ns(CapReadJob), err)
}

func (c *client) Logs(alloc *api.Allocation, task, stream string, follow bool, cancel <-chan struct{}) (<-chan *api.StreamFrame, <-chan error) {
	frames, errs := c.c.AllocFS().Logs(alloc, follow, task, stream, api.OriginStart, 0, cancel, nil)
	if frames != nil {
		return frames, errs
	}
	// The request itself failed (a refusal among other things): its one
	// error is already in errs. It gets the explanation every other
	// request's error gets.
	err := <-errs
	if pe := c.permissionError("reading the "+stream+" of "+alloc.Name, c.ns(CapReadLogs), err); pe != nil {
		err = pe
	}
	out := make(chan error, 1)
	out <- err
	return nil, out
}

func (c *client) Nodes(q *api.QueryOptions) ([]*api.NodeListStub, *api.QueryMeta, error) {
	n, m, err := c.c.Nodes().List(q)
	return n, m, c.explain("listing nodes", nodeRead, err)
}

func (c *client) Node(nodeID string) (*api.Node, error) {
	n, _, err := c.c.Nodes().Info(nodeID, nil)
	return n, c.explain("reading node "+nodeID, nodeRead, err)
}

func (c *client) NodeAllocations(nodeID string) ([]*api.Allocation, error) {
	a, _, err := c.c.Nodes().Allocations(nodeID, nil)
	return a, c.explain("listing the allocations of node "+nodeID, nodeRead, err)
}

func (c *client) NodeStats(nodeID string) (*api.HostStats, error) {
	s, err := c.c.Nodes().Stats(nodeID, nil)
	return s, c.explain("reading the stats of node "+nodeID, nodeRead, err)
}
