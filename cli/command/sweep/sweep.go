// Package sweep is `gpujob sweep`: hyperparameter sweeps run by a
// controller job, with their records in Consul KV.
package sweep

import (
	"context"

	consul "github.com/hashicorp/consul/api"
	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/sweepcreds"
	"github.com/gpujob/gpujob/cli/sweepjob"
	"github.com/gpujob/gpujob/cli/sweepops"
	"github.com/gpujob/gpujob/internal/sweep/controller"
)

// EnvKeyPrefix overrides where sweeps live in Consul KV (sweepjob's).
const EnvKeyPrefix = sweepjob.EnvKeyPrefix

// NewCmd returns the sweep command and its subcommands.
func NewCmd(f *factory.Factory) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sweep",
		Short: "Run hyperparameter sweeps: many trials of a train spec, searched and stopped early",
		Long: `A sweep spec holds a train block whose command, args and env may use
param.NAME, the params' search space, the objective metric, the search
algorithm (grid, random or tpe), an optional early stopping rule (asha or
median) and the limits (max_trials, parallel, max_failed_trials).

gpujob sweep submit registers a controller job that proposes the trials, runs
each as a Nomad job of its own, reads the metric lines rank 0 prints
(gpujob-metric: {"step": N, "<metric>": V}) from Consul, stops bad trials
early and ends the sweep. Its state lives in Consul KV: the CLI can exit at
any moment, and a restarted controller resumes where the last one stopped.

Sweeps use Consul directly: CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN,
CONSUL_CACERT, CONSUL_CLIENT_CERT and CONSUL_CLIENT_KEY, like the consul CLI.`,
		Example: `  gpujob sweep submit jobspecs/examples/sweep-toy.hcl
  gpujob sweep status toy-lr
  gpujob sweep best toy-lr -json
  gpujob sweep extend toy-lr --max-trials +4
  gpujob sweep stop --purge toy-lr`,
	}
	for _, sub := range []func(*factory.Factory) *cobra.Command{
		newSubmitCmd, newStatusCmd, newBestCmd, newReportCmd, newStopCmd, newExtendCmd, newRenderCmd, newControllerCmd,
	} {
		cmd.AddCommand(sub(f))
	}
	return cmd
}

// env is what every sweep command works with.
type env struct {
	f      *factory.Factory
	consul *consul.Client
	nomad  nomadapi.API
	ns     string
	prefix string
	// acl says which clusters enforce ACLs (detectACL), for the commands
	// that register a controller or purge one.
	acl sweepcreds.Mode
}

// sweeps is e's sweeps as the library that acts on them sees them.
func (e *env) sweeps() *sweepops.Sweeps {
	s := &sweepops.Sweeps{Consul: e.consul, Nomad: e.nomad, Namespace: e.ns, Prefix: e.prefix, ACL: e.acl}
	if e.f != nil {
		s.Now = e.f.Now
	}
	return s
}

// detectACL asks Nomad and Consul whether they enforce ACLs.
func (e *env) detectACL() error {
	s := e.sweeps()
	if err := s.DetectACL(); err != nil {
		return err
	}
	e.acl = s.ACL
	return nil
}

// issuer issues and revokes the credentials of sweep name's controller.
func (e *env) issuer(name string) (*sweepcreds.Issuer, error) { return e.sweeps().Issuer(name) }

func newEnv(f *factory.Factory, needNomad bool) (*env, error) {
	e := &env{f: f, ns: f.Namespace(), prefix: keyPrefix()}
	var err error
	if e.consul, err = f.Consul(); err != nil {
		return nil, err
	}
	if needNomad {
		if e.nomad, err = f.Nomad(); err != nil {
			return nil, err
		}
	}
	return e, nil
}

func keyPrefix() string { return sweepjob.KeyPrefix() }

// load reads a sweep's record and state; a sweep that was never submitted
// is an error that says so.
func (e *env) load(ctx context.Context, name string) (*sweepjob.Record, *controller.State, uint64, error) {
	return e.sweeps().Load(ctx, name)
}
