package sweep

import (
	"context"
	"fmt"
	"log"
	"os"

	consul "github.com/hashicorp/consul/api"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/sweepcreds"
	"github.com/gpujob/gpujob/cli/sweepjob"
	"github.com/gpujob/gpujob/internal/sweep/controller"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

func newControllerCmd(f *factory.Factory) *cobra.Command {
	return &cobra.Command{
		Use:    "controller SWEEP",
		Short:  "Run a sweep's controller (what the controller job runs; not for people)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runController(cmd.Context(), f, args[0])
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
	plan, err := controllerPlan(rec, e.ns, name, digest, creds)
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

// controllerPlan is the plan the controller runs: the record's, or, for a
// record that fails its checks (sweepjob.Record.Verify), one that fails the
// sweep with the reason and runs nothing. With credentials (a cluster with
// ACLs) the record must also be, byte for byte, what submit wrote.
func controllerPlan(rec *sweepjob.Record, ns, name, digest string, creds *sweepcreds.Credentials) (*controller.Plan, error) {
	var why error
	switch {
	case creds != nil && creds.RecordDigest == "":
		why = fmt.Errorf("the controller's variable %s holds no digest of the sweep's record (submitted by an older gpujob?), "+
			"so nothing vouches for its trial template", sweepcreds.VariablePath(controller.ControllerJobID(name)))
	case creds != nil:
		why = rec.Verify(ns, name, digest, creds.RecordDigest)
	default:
		why = rec.Verify(ns, name, digest, "")
	}
	if why != nil {
		return &controller.Plan{Namespace: ns, Sweep: name, MaxTrials: 1, Parallel: 1,
			Refused: fmt.Sprintf("the controller refused the sweep's record %s: %v; no trial of it is launched "+
				"(gpujob sweep stop --purge %s, then submit it again)", sweepkv.SpecKey(keyPrefix(), ns, name), why, name)}, nil
	}
	return rec.Plan()
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
