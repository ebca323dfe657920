package sweep

import (
	"context"
	"log"
	"os"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/sweepjob"
	"github.com/gpujob/gpujob/internal/sweep/controller"
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
	e, err := newEnv(f, true)
	if err != nil {
		return err
	}
	logger := log.New(f.IO.ErrOut, "", log.LstdFlags)
	rec, err := sweepjob.LoadRecord(ctx, e.consul, e.prefix, e.ns, name)
	if err != nil {
		return err
	}
	if rec == nil {
		// Purged: nothing is left to run, and a failure would only have
		// Nomad restart this task again and again.
		logger.Printf("no sweep %q in namespace %s: its record is gone (purged); nothing to do", name, e.ns)
		return nil
	}
	plan, err := rec.Plan()
	if err != nil {
		return err
	}
	c := &controller.Controller{
		Consul: e.consul, Prefix: e.prefix, Plan: plan,
		Launcher: &sweepjob.Launcher{Nomad: e.nomad, Template: rec.Template, Sweep: rec.Sweep, Run: rec.Run()},
		AllocID:  os.Getenv("NOMAD_ALLOC_ID"), Logf: logger.Printf, Now: f.Now,
	}
	return c.Run(ctx)
}
