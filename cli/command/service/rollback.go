package service

import (
	"context"
	"fmt"

	"github.com/hashicorp/nomad/api"
	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/cmdutil"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/servestore"
	"github.com/gpujob/gpujob/cli/servicedeploy"
	"github.com/gpujob/gpujob/internal/contract"
)

func newRollbackCmd(f *factory.Factory) *cobra.Command {
	var to int64
	var detach bool
	cmd := &cobra.Command{
		Use:   "rollback NAME",
		Short: "Roll a service back to its previous good version",
		Long: `Rollback makes an earlier job version of the service current again and
follows the rolling update to it. Without --to-version it picks the newest
stable version (one whose deployment succeeded) that serves another version
than the current one.`,
		Example: `  gpujob service rollback bert-clf
  gpujob service rollback bert-clf --to-version 3`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			nomad, err := f.Nomad()
			if err != nil {
				return err
			}
			if _, err := loadService(nomad, args[0]); err != nil {
				return err
			}
			versions, err := nomad.JobVersions(args[0])
			if err != nil {
				return err
			}
			target, err := rollbackTarget(versions, to)
			if err != nil {
				return fmt.Errorf("service %s: %w", args[0], err)
			}
			reg, err := nomad.Revert(args[0], deref(target.Version))
			if err != nil {
				return err
			}
			// The route of the version it goes back to (its job meta).
			store, err := servestore.Open(f)
			if err != nil {
				return err
			}
			if err := servicedeploy.PutRouteOf(ctx, store, target); err != nil {
				fmt.Fprintf(f.IO.ErrOut, "gpujob: the gateway route stays as it was: %v\n", err)
			}
			fmt.Fprintf(f.IO.Out, "rolling %s back to %s (job version %d), evaluation %s\n",
				args[0], target.Meta[contract.MetaVersion], deref(target.Version), shortOr(reg.EvalID))
			if detach {
				return nil
			}
			cur, err := nomad.Job(args[0])
			if err != nil {
				return err
			}
			d, err := servicedeploy.Watch(ctx, nomad, args[0], deref(cur.Version), progressTo(f.IO.Out, false))
			if err != nil {
				return err
			}
			if d != nil && d.Status != api.DeploymentStatusSuccessful {
				return &cmdutil.ExitError{Code: 1, Err: fmt.Errorf("rollback of %s %s: %s", args[0], d.Status, d.StatusDescription)}
			}
			fmt.Fprintf(f.IO.Out, "%s serves %s again\n", args[0], target.Meta[contract.MetaVersion])
			return nil
		},
	}
	cmd.Flags().Int64Var(&to, "to-version", -1, "the Nomad job `version` to go back to")
	cmd.Flags().BoolVar(&detach, "detach", false, "return once the rollback is registered")
	return cmd
}

// rollbackTarget is the version to go back to: to when given (it must not
// be the current one), else the newest stable one that serves another
// version than the current. versions is newest first.
func rollbackTarget(versions []*api.Job, to int64) (*api.Job, error) {
	if len(versions) == 0 {
		return nil, fmt.Errorf("no job versions")
	}
	cur := versions[0]
	if to >= 0 {
		if uint64(to) == deref(cur.Version) {
			return nil, fmt.Errorf("job version %d is the current one", to)
		}
		for _, v := range versions {
			if deref(v.Version) == uint64(to) {
				return v, nil
			}
		}
		return nil, fmt.Errorf("no job version %d (Nomad keeps the last few)", to)
	}
	for _, v := range versions[1:] {
		if deref(v.Stable) && v.Meta[contract.MetaVersion] != cur.Meta[contract.MetaVersion] {
			return v, nil
		}
	}
	return nil, fmt.Errorf("no earlier stable version serves another version than %s; name one with --to-version", cur.Meta[contract.MetaVersion])
}
