// Package service is `gpujob service`: model servers from service specs,
// run as Nomad service jobs behind the gpujob gateway.
package service

import (
	"github.com/hashicorp/nomad/api"
	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gatewayclient"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/servestore"
	"github.com/gpujob/gpujob/cli/servicedeploy"
)

// NewCmd returns the service command and its subcommands.
func NewCmd(f *factory.Factory) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "service",
		Short: "Serve models: replicas behind the gpujob gateway, rolling updates, scaling",
		Long: `A service spec describes a model server: the command every replica runs (it
listens on $PORT and answers its health path once the model is loaded), the
GPUs per replica, the replica bounds, the health check, the rolling update,
autoscaling on requests in flight, and the gateway route (path, bearer tokens,
rate limit per token).

gpujob service deploy registers it as a Nomad service job on the gpujob driver,
registered in Consul with its health check, and writes the route the gpujob
gateways follow (Consul KV). A new deploy of a running service is a rolling
update: through canaries when the spec asks for them, promoted once healthy,
and reverted to the last good version when they never are.

Services use Nomad (NOMAD_ADDR, NOMAD_TOKEN, ...) and Consul (CONSUL_HTTP_ADDR,
CONSUL_HTTP_TOKEN, ...); the gateway's address is $GPUJOB_GATEWAY_ADDR or
--gateway.`,
		Example: `  gpujob service deploy jobspecs/examples/serve-bert.hcl
  gpujob token create --service bert-clf
  gpujob service status bert-clf
  gpujob service scale bert-clf 3
  gpujob service rollback bert-clf
  gpujob service logs bert-clf -f
  gpujob service stop bert-clf`,
	}
	for _, sub := range []func(*factory.Factory) *cobra.Command{
		newDeployCmd, newRenderCmd, newStatusCmd, newScaleCmd, newRollbackCmd, newLogsCmd, newStopCmd,
	} {
		cmd.AddCommand(sub(f))
	}
	return cmd
}

func addGatewayFlag(cmd *cobra.Command, dst *string) {
	cmd.Flags().StringVar(dst, "gateway", "", "the gpujob gateway's `URL` (default $"+gatewayclient.EnvGateway+", else "+gatewayclient.DefaultGateway+")")
}

// IsService reports whether job is a gpujob service's.
func IsService(job *api.Job) bool { return servicedeploy.IsService(job) }

func firstOf(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// clients opens what the verbs that act on a deployed service need: the
// Nomad API and the services' records in Consul.
func clients(f *factory.Factory) (nomadapi.API, servestore.Store, error) {
	nomad, err := f.Nomad()
	if err != nil {
		return nil, servestore.Store{}, err
	}
	store, err := servestore.Open(f)
	if err != nil {
		return nil, servestore.Store{}, err
	}
	return nomad, store, nil
}
