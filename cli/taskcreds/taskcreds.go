// Package taskcreds reads the credentials of one of gpujob's own Nomad jobs
// (a gateway, an exporter) from its Nomad variable, with the task's
// workload identity through its Task API socket, and keeps them in memory:
// no token is ever in the job or the task's environment, where whoever may
// read the job, or any process of the same user, could see it. The socket
// needs no TLS file of the node, so Nomad is reached through it too.
package taskcreds

import (
	"fmt"

	consul "github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/cli/nomadapi"
)

// The items of a component's variable, each optional.
const (
	ItemConsulToken = "consul_token"
	ItemNomadToken  = "nomad_token"
	ItemConsulCA    = "consul_ca_pem"
	ItemConsulCert  = "consul_cert_pem"
	ItemConsulKey   = "consul_key_pem"
)

// Creds are a component's secrets, read from its variable.
type Creds struct {
	// Path is the variable's, for messages ("the variable <path>").
	Path   string
	socket string
	items  map[string]string
}

// Load reads the variable at path; what names the component for messages
// ("the gateway's", "the exporter's") and hint says what to put there when
// the variable is missing.
func Load(path, what, hint string) (*Creds, error) {
	sock, jwt, err := nomadapi.TaskAPI()
	if err != nil {
		return nil, err
	}
	wi, err := nomadapi.New(nomadapi.Options{Socket: sock, Token: jwt})
	if err != nil {
		return nil, err
	}
	v, err := wi.Variable(path)
	if err != nil {
		return nil, fmt.Errorf("reading %s credentials (variable %s): %w", what, path, err)
	}
	if v == nil {
		return nil, fmt.Errorf("no variable %s: %s", path, hint)
	}
	return &Creds{Path: path, socket: sock, items: v.Items}, nil
}

// Item is one item of the variable ("" when absent).
func (c *Creds) Item(name string) string { return c.items[name] }

// Consul is a Consul client at CONSUL_HTTP_ADDR with the variable's token and
// TLS material.
func (c *Creds) Consul() (*consul.Client, error) {
	cfg := consul.DefaultConfig()
	cfg.Token = c.items[ItemConsulToken]
	cfg.TLSConfig.CAPem, cfg.TLSConfig.CertPEM, cfg.TLSConfig.KeyPEM =
		bytesOf(c.items[ItemConsulCA]), bytesOf(c.items[ItemConsulCert]), bytesOf(c.items[ItemConsulKey])
	client, err := consul.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("consul client (CONSUL_HTTP_ADDR): %w", err)
	}
	return client, nil
}

// Nomad is a Nomad client through the Task API socket with the variable's
// token, in namespace ns ("" for the default).
func (c *Creds) Nomad(ns string) (nomadapi.API, error) {
	return nomadapi.New(c.NomadOptions(ns))
}

// NomadOptions are the settings Nomad makes its client with: the Task API
// socket and the variable's token, in namespace ns ("" for the default),
// for nomadapi.NewRaw.
func (c *Creds) NomadOptions(ns string) nomadapi.Options {
	return nomadapi.Options{Socket: c.socket, Token: c.items[ItemNomadToken], Namespace: ns}
}

func bytesOf(s string) []byte {
	if s == "" {
		return nil
	}
	return []byte(s)
}
