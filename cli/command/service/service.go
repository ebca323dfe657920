// Package service is `gpujob service`: model servers from service specs,
// run as Nomad service jobs behind the gpujob gateway.
package service

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/hashicorp/nomad/api"
	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/command/gpujobs"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/servestore"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/servekv"
)

// EnvGateway is the gateway's address, for the endpoint URL and the
// traffic figures of `service status` (--gateway).
const EnvGateway = "GPUJOB_GATEWAY_ADDR"

// DefaultGateway is the gateway `make dev` starts.
const DefaultGateway = "http://127.0.0.1:8080"

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

// KeyPrefix is where services live in Consul KV: $GPUJOB_SERVICE_KEY_PREFIX,
// else servekv.DefaultPrefix.
func KeyPrefix() string {
	if p := os.Getenv(servestore.EnvKeyPrefix); p != "" {
		return strings.TrimSuffix(p, "/")
	}
	return servekv.DefaultPrefix
}

// Store is the services' records in the factory's Consul.
func Store(f *factory.Factory) (servestore.Store, error) {
	c, err := f.Consul()
	if err != nil {
		return servestore.Store{}, err
	}
	s := servestore.New(c, KeyPrefix())
	s.Addr = firstOf(os.Getenv("CONSUL_HTTP_ADDR"), "127.0.0.1:8500")
	return s, nil
}

// gatewayAddr is --gateway, else $GPUJOB_GATEWAY_ADDR, else DefaultGateway.
func gatewayAddr(flag string) string {
	return strings.TrimSuffix(firstOf(flag, os.Getenv(EnvGateway), DefaultGateway), "/")
}

// EnvGatewayAdmin is the gateway's admin address (its /metrics and
// /-/stats; gpujob gateway run --admin-listen), for the traffic figures of
// `service status` (--gateway-admin) and of `gpujob top`.
const EnvGatewayAdmin = "GPUJOB_GATEWAY_ADMIN_ADDR"

// EnvGatewayAdminToken is the bearer token of a gateway's admin listener
// that asks for one.
const EnvGatewayAdminToken = "GPUJOB_GATEWAY_ADMIN_TOKEN"

// GatewayAdminAddr is the gateway's admin URL: flag, else
// $GPUJOB_GATEWAY_ADMIN_ADDR, else the gateway's host on the port after
// its own (where gpujob gateway render puts it; the admin listener is on
// loopback by default, so that works on the gateway's node).
func GatewayAdminAddr(flag, gateway string) string {
	if a := firstOf(flag, os.Getenv(EnvGatewayAdmin)); a != "" {
		return strings.TrimSuffix(a, "/")
	}
	u, err := url.Parse(gateway)
	if err != nil || u.Port() == "" {
		return gateway
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		return gateway
	}
	u.Host = net.JoinHostPort(u.Hostname(), strconv.Itoa(port+1))
	return strings.TrimSuffix(u.String(), "/")
}

func addGatewayFlag(cmd *cobra.Command, dst *string) {
	cmd.Flags().StringVar(dst, "gateway", "", "the gpujob gateway's `URL` (default $"+EnvGateway+", else "+DefaultGateway+")")
}

// errNoService is loadService's answer when Nomad has no such job.
var errNoService = errors.New("not found")

// loadService reads a job and refuses one that is not a gpujob service.
func loadService(nomad nomadapi.API, name string) (*api.Job, error) {
	job, err := nomad.Job(name)
	if err != nil && !gpujobs.IsNotFound(err) {
		return nil, err
	}
	if job == nil {
		return nil, fmt.Errorf("service %q %w in Nomad at %s", name, errNoService, nomad.Address())
	}
	if !IsService(job) {
		return nil, fmt.Errorf("job %q is not a gpujob service (its meta has no %s = %q); use `nomad job status %s`",
			name, contract.MetaKind, contract.KindService, name)
	}
	return job, nil
}

// IsService reports whether job is a gpujob service's.
func IsService(job *api.Job) bool {
	return job != nil && job.Meta[contract.MetaKind] == contract.KindService
}

// group is the job's replica group.
func group(job *api.Job) *api.TaskGroup {
	for _, g := range job.TaskGroups {
		if g.Name != nil && *g.Name == render.ServiceGroup {
			return g
		}
	}
	return nil
}

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
