package gateway

import (
	"fmt"
	"os"

	consul "github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/taskcreds"
)

// itemAdminToken is the item of the gateways' variable
// (render.GatewayVariable) that holds the bearer token of the gateway's
// admin listener (/metrics, /-/stats), which it needs to listen beyond
// loopback; the tokens and TLS material are taskcreds' items.
const itemAdminToken = "admin_token"

// credentials are what a gateway acts with: from its variable with
// --secrets (render.EnvGatewaySecrets set), else from the environment.
type credentials struct {
	consul *consul.Client
	// nomad makes a Nomad client for a namespace.
	nomad func(ns string) (nomadapi.API, error)
	from  string // for the log
	// adminToken guards the admin listener; "" = none (loopback only).
	adminToken string
}

// loadCredentials reads the variable the environment names, if any (package
// taskcreds): Consul gets the token and TLS material from it, Nomad is
// reached through the Task API socket with the variable's token.
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
	creds, err := taskcreds.Load(path, "the gateway's",
		fmt.Sprintf("put the gateways' tokens there (nomad var put %s consul_token=... nomad_token=...)", path))
	if err != nil {
		return nil, fmt.Errorf("%s is set: %w", render.EnvGatewaySecrets, err)
	}
	c, err := creds.Consul()
	if err != nil {
		return nil, err
	}
	return &credentials{consul: c, from: "the variable " + path, adminToken: creds.Item(itemAdminToken), nomad: creds.Nomad}, nil
}
