package gateway

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/render"
)

// forwarded is the environment the gateway job passes on to the gateways
// (addresses and TLS files; never a token, which a job's env would show to
// everyone who may read the job).
var forwarded = []string{"CONSUL_HTTP_ADDR", "CONSUL_HTTP_SSL", "CONSUL_CACERT", "CONSUL_CLIENT_CERT", "CONSUL_CLIENT_KEY",
	"NOMAD_ADDR", "NOMAD_CACERT", "NOMAD_CLIENT_CERT", "NOMAD_CLIENT_KEY", "GPUJOB_SERVICE_KEY_PREFIX"}

// fromVariable reports whether, with --secrets, the gateways get what the
// environment variable k gives some other way: Consul's TLS material from
// the variable, Nomad through their Task API socket.
func fromVariable(k string) bool {
	switch k {
	case "CONSUL_CACERT", "CONSUL_CLIENT_CERT", "CONSUL_CLIENT_KEY",
		"NOMAD_ADDR", "NOMAD_CACERT", "NOMAD_CLIENT_CERT", "NOMAD_CLIENT_KEY":
		return true
	}
	return false
}

func newRenderCmd(f *factory.Factory) *cobra.Command {
	g := render.Gateway{}
	cmd := &cobra.Command{
		Use:   "render",
		Short: "Print the Nomad job that runs the gateways",
		Long: `Render prints a Nomad service job running --count gateways (raw_exec, one per
node on the static --port, its admin listener, /metrics and /-/stats, on
127.0.0.1 at the static --admin-port, or with --admin-public on the node's
address behind the admin token of the gateways' variable), registered in
Consul as gpujob-gateway with a check on /-/healthz, and the admin listener
as gpujob-gateway-admin. It passes on the Consul and Nomad addresses and TLS
files of this environment (CONSUL_HTTP_ADDR, NOMAD_ADDR, ...), never a token.

On a cluster with ACLs or TLS, --secrets has the gateways read their Consul
and Nomad tokens and Consul's TLS material from the Nomad variable
nomad/jobs/gpujob-gateway (items consul_token, nomad_token, consul_ca_pem,
consul_cert_pem, consul_key_pem, admin_token, each optional) with their workload
identity, hold them in memory, talk to Nomad through their Task API socket,
and run as the user gpujob-gateway (replicas run as nobody). The tokens
need the policies of jobspecs/acl/consul-gpujob-gateway.hcl and
nomad-gpujob-gateway.hcl.`,
		Example: `  gpujob gateway render --binary /usr/local/bin/gpujob | nomad job run -
  nomad var put nomad/jobs/gpujob-gateway consul_token=... nomad_token=...
  gpujob gateway render --secrets | nomad job run -`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if g.Binary == "" {
				exe, err := os.Executable()
				if err != nil {
					return fmt.Errorf("--binary: %w", err)
				}
				g.Binary, _ = filepath.Abs(exe)
			}
			g.Env = map[string]string{}
			for _, k := range forwarded {
				if v := os.Getenv(k); v != "" && !(g.Secrets && fromVariable(k)) {
					g.Env[k] = v
				}
			}
			if g.Namespace == "" {
				g.Namespace = strings.TrimSpace(os.Getenv("NOMAD_NAMESPACE"))
			}
			out, err := render.GatewayJobspec(g)
			if err != nil {
				return err
			}
			_, err = f.IO.Out.Write(out)
			return err
		},
	}
	cmd.Flags().StringVar(&g.Binary, "binary", "", "the gpujob `path` on the clients (default: this executable)")
	cmd.Flags().IntVar(&g.Count, "count", 1, "gateways to run, one per node")
	cmd.Flags().IntVar(&g.Port, "port", render.DefaultGatewayPort, "the static `port` they listen on")
	cmd.Flags().IntVar(&g.AdminPort, "admin-port", 0, "the static `port` of their admin listener, on 127.0.0.1 (default --port + 1)")
	cmd.Flags().BoolVar(&g.AdminPublic, "admin-public", false,
		"the admin listener on the node's address, behind the admin_token of the gateways' variable (needs --secrets)")
	cmd.Flags().StringVar(&g.User, "user", "", "the `user` they run as (default nobody; gpujob-gateway with --secrets)")
	cmd.Flags().BoolVar(&g.Secrets, "secrets", false,
		"read the gateways' tokens and TLS files from the Nomad variable "+render.GatewayVariable+" (a cluster with ACLs or TLS)")
	cmd.Flags().StringSliceVar(&g.Datacenters, "datacenters", nil, "datacenters to run in (default all)")
	cmd.Flags().StringVar(&g.NodePool, "node-pool", "", "node pool to run in")
	return cmd
}
