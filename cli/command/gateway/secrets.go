package gateway

import (
	"fmt"
	"os"

	consul "github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/render"
)

// The items of the gateways' variable (render.GatewayVariable), each
// optional.
const (
	itemConsulToken = "consul_token"
	itemNomadToken  = "nomad_token"
	itemConsulCA    = "consul_ca_pem"
	itemConsulCert  = "consul_cert_pem"
	itemConsulKey   = "consul_key_pem"
)

// credentials are what a gateway acts with: from its variable with
// --secrets (render.EnvGatewaySecrets set), else from the environment.
type credentials struct {
	consul *consul.Client
	// nomad makes a Nomad client for a namespace.
	nomad func(ns string) (nomadapi.API, error)
	from  string // for the log
}

// loadCredentials reads the variable the environment names, if any, with
// the task's workload identity through its Task API socket, and keeps the
// secrets in memory: Consul gets the token and TLS material from it, Nomad
// is reached through the socket with the variable's token (the socket
// needs no TLS file of the node).
func loadCredentials(envConsul func() (*consul.Client, error)) (*credentials, error) {
	path := os.Getenv(render.EnvGatewaySecrets)
	if path == "" {
		c, err := envConsul()
		if err != nil {
			return nil, err
		}
		return &credentials{consul: c, from: "the environment",
			nomad: func(ns string) (nomadapi.API, error) { return nomadapi.New(nomadapi.Options{Namespace: ns}) }}, nil
	}
	sock, jwt, err := nomadapi.TaskAPI()
	if err != nil {
		return nil, fmt.Errorf("%s is set: %w", render.EnvGatewaySecrets, err)
	}
	wi, err := nomadapi.New(nomadapi.Options{Socket: sock, Token: jwt})
	if err != nil {
		return nil, err
	}
	v, err := wi.Variable(path)
	if err != nil {
		return nil, fmt.Errorf("reading the gateway's credentials (variable %s): %w", path, err)
	}
	if v == nil {
		return nil, fmt.Errorf("no variable %s: put the gateways' tokens there (nomad var put %s consul_token=... nomad_token=...)", path, path)
	}
	cfg := consul.DefaultConfig()
	cfg.Token = v.Items[itemConsulToken]
	cfg.TLSConfig.CAPem, cfg.TLSConfig.CertPEM, cfg.TLSConfig.KeyPEM =
		bytesOf(v.Items[itemConsulCA]), bytesOf(v.Items[itemConsulCert]), bytesOf(v.Items[itemConsulKey])
	c, err := consul.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("consul client (CONSUL_HTTP_ADDR): %w", err)
	}
	token := v.Items[itemNomadToken]
	return &credentials{consul: c, from: "the variable " + path,
		nomad: func(ns string) (nomadapi.API, error) {
			return nomadapi.New(nomadapi.Options{Socket: sock, Token: token, Namespace: ns})
		}}, nil
}

func bytesOf(s string) []byte {
	if s == "" {
		return nil
	}
	return []byte(s)
}
