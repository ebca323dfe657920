// Package factory builds what commands depend on — the Nomad API and the IO
// streams — so a test can hand a command a fake API and buffers.
package factory

import (
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/cli/iostreams"
	"github.com/gpujob/gpujob/cli/nomadapi"
)

// Factory is passed to every command's constructor.
type Factory struct {
	IO *iostreams.IOStreams
	// Nomad returns the API client, built from the global flags and the
	// NOMAD_* environment when first asked.
	Nomad func() (nomadapi.API, error)
	// Consul returns the Consul API client, from the CONSUL_HTTP_* and
	// CONSUL_* environment like the consul CLI (sweeps keep their records
	// there).
	Consul func() (*consul.Client, error)
	// Namespace is the Nomad namespace the commands act in (--namespace,
	// else NOMAD_NAMESPACE, else "default").
	Namespace func() string
	// Now is the clock (tests pin it).
	Now func() time.Time
}
