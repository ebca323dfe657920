package exporter

import (
	"fmt"
	"os"

	consul "github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/taskcreds"
)

// credentials are what an exporter reads the cluster with.
type credentials struct {
	nomad nomadapi.API
	// consul is nil when Consul cannot be reached from here (no sweeps).
	consul    *consul.Client
	consulErr error
	from      string // for the log
}

// loadCredentials reads, on a cluster with ACLs or TLS (the job's
// render.EnvExporterSecrets is set), the exporter's tokens and Consul TLS
// material from its Nomad variable (render.ExporterVariable), as the
// gateways and the sweep controllers get theirs (package taskcreds).
// Otherwise it is the CLI's own Nomad and Consul from the environment.
func loadCredentials(f *factory.Factory) (*credentials, error) {
	path := os.Getenv(render.EnvExporterSecrets)
	if path == "" {
		nomad, err := f.Nomad()
		if err != nil {
			return nil, err
		}
		c, cerr := f.Consul()
		return &credentials{nomad: nomad, consul: c, consulErr: cerr, from: "the environment"}, nil
	}
	creds, err := taskcreds.Load(path, "the exporter's", fmt.Sprintf("put the exporters' tokens there (nomad var put %s consul_token=... nomad_token=...; "+
		"their policies: gpujob acl policy nomad-exporter, consul-exporter)", path))
	if err != nil {
		return nil, fmt.Errorf("%s is set: %w", render.EnvExporterSecrets, err)
	}
	nomad, err := creds.Nomad("")
	if err != nil {
		return nil, err
	}
	c, cerr := creds.Consul()
	return &credentials{nomad: nomad, consul: c, consulErr: cerr, from: "the variable " + path}, nil
}
