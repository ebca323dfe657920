// Package sweep is `gpujob sweep`: hyperparameter sweeps run by a
// controller job, with their records in Consul KV.
package sweep

import (
	"context"
	"errors"
	"fmt"
	"os"

	consul "github.com/hashicorp/consul/api"
	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/sweepcreds"
	"github.com/gpujob/gpujob/cli/sweepjob"
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

// detectACL asks Nomad and Consul whether they enforce ACLs.
func (e *env) detectACL() error {
	m, err := sweepcreds.Detect(e.nomad, sweepcreds.NewConsul(e.consul))
	if err != nil {
		return err
	}
	e.acl = m
	return nil
}

// credentials detects whether the clusters enforce ACLs and returns the
// issuer of sweep name's controller credentials.
func (e *env) credentials(name string) (*sweepcreds.Issuer, error) {
	if err := e.detectACL(); err != nil {
		return nil, err
	}
	return e.issuer(name)
}

// issuer issues and revokes the credentials of sweep name's controller.
// The Consul TLS files the CLI uses are read here, to be handed over.
func (e *env) issuer(name string) (*sweepcreds.Issuer, error) {
	is := &sweepcreds.Issuer{Nomad: e.nomad, Consul: sweepcreds.NewConsul(e.consul), Mode: e.acl,
		Namespace: e.ns, Sweep: name, KeyPrefix: e.prefix, JobID: controller.ControllerJobID(name)}
	for _, f := range []struct {
		env string
		to  *[]byte
	}{{"CONSUL_CACERT", &is.ConsulTLS.CA}, {"CONSUL_CLIENT_CERT", &is.ConsulTLS.Cert}, {"CONSUL_CLIENT_KEY", &is.ConsulTLS.Key}} {
		path := os.Getenv(f.env)
		if path == "" || !e.acl.Any() {
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.env, err)
		}
		*f.to = b
	}
	return is, nil
}

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
	rec, err := sweepjob.LoadRecord(ctx, e.consul, e.prefix, e.ns, name)
	if err != nil {
		return nil, nil, 0, err
	}
	st, index, err := controller.LoadState(ctx, e.consul, e.prefix, e.ns, name)
	if err != nil {
		return nil, nil, 0, err
	}
	if rec == nil && index == 0 {
		return nil, nil, 0, fmt.Errorf("%w %q in namespace %s (Consul at %s)", errNoSweep, name, e.ns, consulAddr())
	}
	if rec == nil {
		return nil, nil, 0, fmt.Errorf("sweep %q has a state but no record in Consul: remove it with gpujob sweep stop --purge %s", name, name)
	}
	return rec, st, index, nil
}

func consulAddr() string {
	if a := os.Getenv(consul.HTTPAddrEnvName); a != "" {
		return a
	}
	return "127.0.0.1:8500"
}

// errNoSweep: no record and no state of that name.
var errNoSweep = errors.New("no sweep")

// update applies change to the sweep's state with check-and-set, retrying
// on a concurrent write (the controller saves every round).
func (e *env) update(ctx context.Context, name string, change func(*controller.State) error) (*controller.State, error) {
	for {
		st, index, err := controller.LoadState(ctx, e.consul, e.prefix, e.ns, name)
		if err != nil {
			return nil, err
		}
		if err := change(st); err != nil {
			return nil, err
		}
		ok, err := controller.SaveState(ctx, e.consul, e.prefix, st, index)
		if err != nil {
			return nil, err
		}
		if ok {
			return st, nil
		}
	}
}
