package service

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/servestore"
)

func newStopCmd(f *factory.Factory) *cobra.Command {
	var purge bool
	cmd := &cobra.Command{
		Use:   "stop NAME",
		Short: "Stop a service: its route first, then its replicas",
		Long: `Stop removes the service's gateway route (the gateways answer 404 for it
from then on) and stops its Nomad job; each replica leaves Consul before it
is signalled. Its tokens are kept for a later deploy; --purge also removes
them and the job's history.`,
		Example: `  gpujob service stop bert-clf
  gpujob service stop --purge bert-clf`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			nomad, err := f.Nomad()
			if err != nil {
				return err
			}
			store, err := servestore.Open(f)
			if err != nil {
				return err
			}
			ns := f.Namespace()
			_, jobErr := loadService(nomad, args[0])
			if jobErr != nil && !errors.Is(jobErr, errNoService) {
				return jobErr // another kind of job, or Nomad failing
			}
			route, err := store.Route(ctx, ns, args[0])
			if err != nil {
				return err
			}
			if jobErr != nil && route == nil {
				return jobErr
			}
			if err := store.DeleteRoute(ctx, ns, args[0]); err != nil {
				return err
			}
			eval := ""
			if jobErr == nil {
				if eval, err = nomad.Deregister(args[0], purge); err != nil {
					return err
				}
			} else {
				// A route left by a deploy whose job is gone: remove it.
				fmt.Fprintf(f.IO.Out, "%s has no job in Nomad; removed its route\n", args[0])
				if purge {
					return store.DeleteService(ctx, ns, args[0])
				}
				return nil
			}
			what := "stopped"
			if purge {
				if err := store.DeleteService(ctx, ns, args[0]); err != nil {
					return err
				}
				what = "stopped and purged (tokens too)"
			}
			fmt.Fprintf(f.IO.Out, "%s %s, evaluation %s\n", what, args[0], firstOf(shortOr(eval), "-"))
			return nil
		},
	}
	cmd.Flags().BoolVar(&purge, "purge", false, "also remove the service's tokens and the job's history")
	return cmd
}

func shortOr(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}
