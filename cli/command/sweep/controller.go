package sweep

import (
	"context"
	"fmt"
	"log"
	"os"

	consul "github.com/hashicorp/consul/api"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/cmdutil"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/sweepcreds"
	"github.com/gpujob/gpujob/cli/sweepjob"
	"github.com/gpujob/gpujob/internal/sweep/controller"
)

// ControllerOptions is what `sweep controller`'s argument asks for.
type ControllerOptions struct {
	// Name is the sweep (the argument).
	Name string
}

func newControllerCmd(f *factory.Factory) *cobra.Command { return NewControllerCmd(f, nil) }

// NewControllerCmd is the command running runF instead when runF is not
// nil: a test checks the Options the arguments parse into without running.
func NewControllerCmd(f *factory.Factory, runF func(context.Context, *ControllerOptions) error) *cobra.Command {
	o := &ControllerOptions{}
	return &cobra.Command{
		Use:    "controller SWEEP",
		Short:  "Run a sweep's controller (what the controller job runs; not for people)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Name = args[0]
			return cmdutil.Run(cmd.Context(), o, runF, func(ctx context.Context) error { return runController(ctx, f, o.Name) })
		},
	}
}

func runController(ctx context.Context, f *factory.Factory, name string) error {
	logger := log.New(f.IO.ErrOut, "", log.LstdFlags)
	var e *env
	var creds *sweepcreds.Credentials
	var err error
	if path := os.Getenv(sweepcreds.EnvVariable); path != "" {
		if e, creds, err = credentialedEnv(f, path); err == nil {
			logger.Printf("acting with the controller's own Nomad and Consul tokens (variable %s)", path)
		}
	} else {
		e, err = newEnv(f, true)
	}
	if err != nil {
		return err
	}
	rec, digest, err := sweepjob.ReadRecord(ctx, e.consul, e.prefix, e.ns, name)
	if err != nil {
		return err
	}
	if rec == nil {
		// Purged: nothing is left to run, and a failure would only have
		// Nomad restart this task again and again.
		logger.Printf("no sweep %q in namespace %s: its record is gone (purged); nothing to do", name, e.ns)
		return nil
	}
	plan, err := sweepjob.ControllerPlan(rec, e.ns, name, digest, creds)
	if err != nil {
		return err
	}
	if plan.Refused != "" {
		logger.Printf("sweep %s: %s", name, plan.Refused)
	}
	c := &controller.Controller{
		Consul: e.consul, Prefix: e.prefix, Plan: plan,
		Launcher: &sweepjob.Launcher{Nomad: e.nomad, Template: rec.Template, Sweep: rec.Sweep, Run: rec.Run()},
		AllocID:  os.Getenv("NOMAD_ALLOC_ID"), Logf: logger.Printf, Now: f.Now,
	}
	return c.Run(ctx)
}

// credentialedEnv is the controller's env on a cluster with ACLs: its
// workload identity (a file in its secrets dir) reads its credentials from
// the variable at path through the Task API socket, and it then acts with
// them: Nomad through the same socket, Consul at the address it was given.
func credentialedEnv(f *factory.Factory, path string) (*env, *sweepcreds.Credentials, error) {
	sock, jwt, err := nomadapi.TaskAPI()
	if err != nil {
		return nil, nil, fmt.Errorf("%s is set: %w", sweepcreds.EnvVariable, err)
	}
	ns := f.Namespace()
	wi, err := nomadapi.New(nomadapi.Options{Socket: sock, Token: jwt, Namespace: ns})
	if err != nil {
		return nil, nil, err
	}
	creds, err := sweepcreds.Fetch(wi, path)
	if err != nil {
		return nil, nil, err
	}
	nomad, err := nomadapi.New(nomadapi.Options{Socket: sock, Token: creds.NomadToken, Namespace: ns})
	if err != nil {
		return nil, nil, err
	}
	cfg := consul.DefaultConfig()
	cfg.Token = creds.ConsulToken
	cfg.TLSConfig.CAPem, cfg.TLSConfig.CertPEM, cfg.TLSConfig.KeyPEM = creds.ConsulTLS.CA, creds.ConsulTLS.Cert, creds.ConsulTLS.Key
	cc, err := consul.NewClient(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("consul client (CONSUL_HTTP_ADDR): %w", err)
	}
	return &env{f: f, consul: cc, nomad: nomad, ns: ns, prefix: keyPrefix()}, creds, nil
}
