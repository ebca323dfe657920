// Package root is the gpujob command: global flags and the subcommands.
package root

import (
	"fmt"
	"os"

	consul "github.com/hashicorp/consul/api"
	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/command/acl"
	"github.com/gpujob/gpujob/cli/command/exporter"
	"github.com/gpujob/gpujob/cli/command/gateway"
	"github.com/gpujob/gpujob/cli/command/gpus"
	"github.com/gpujob/gpujob/cli/command/list"
	"github.com/gpujob/gpujob/cli/command/logs"
	"github.com/gpujob/gpujob/cli/command/render"
	"github.com/gpujob/gpujob/cli/command/service"
	"github.com/gpujob/gpujob/cli/command/status"
	"github.com/gpujob/gpujob/cli/command/stop"
	"github.com/gpujob/gpujob/cli/command/submit"
	"github.com/gpujob/gpujob/cli/command/sweep"
	"github.com/gpujob/gpujob/cli/command/token"
	"github.com/gpujob/gpujob/cli/command/top"
	"github.com/gpujob/gpujob/cli/command/validate"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/nomadapi"
)

// Version is set at build time with -ldflags.
var Version = "0.1.0"

// NewCmd returns the root command. f.Nomad is replaced by one built from the
// global flags (falling back to the NOMAD_* environment, like `nomad`).
func NewCmd(f *factory.Factory) *cobra.Command {
	var o nomadapi.Options
	cmd := &cobra.Command{
		Use:   "gpujob",
		Short: "Distributed GPU training on Nomad and Consul",
		Long: `gpujob turns a small training spec into a Nomad job that the gpujob task
driver runs as one distributed training group: gang-started, ranked through a
Consul rendezvous, restarted together from its checkpoint.

It talks to Nomad like the nomad CLI: NOMAD_ADDR, NOMAD_TOKEN,
NOMAD_NAMESPACE, NOMAD_REGION, NOMAD_CACERT, NOMAD_CLIENT_CERT and
NOMAD_CLIENT_KEY, or the flags below.`,
		Example: `  gpujob validate jobspecs/examples/bert-finetune.hcl
  gpujob submit jobspecs/examples/bert-finetune.hcl
  gpujob status bert-finetune
  gpujob logs bert-finetune --rank 1 -f
  gpujob gpus`,
		Version:       Version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&o.Address, "address", "", "Nomad HTTP address (default $NOMAD_ADDR, else http://127.0.0.1:4646)")
	pf.StringVar(&o.Token, "token", "", "Nomad ACL token (default $NOMAD_TOKEN)")
	pf.StringVar(&o.Namespace, "namespace", "", "Nomad namespace (default $NOMAD_NAMESPACE)")
	pf.StringVar(&o.Region, "region", "", "Nomad region (default $NOMAD_REGION)")
	pf.StringVar(&o.CACert, "ca-cert", "", "CA certificate for TLS (default $NOMAD_CACERT)")
	pf.StringVar(&o.ClientCert, "client-cert", "", "client certificate for TLS (default $NOMAD_CLIENT_CERT)")
	pf.StringVar(&o.ClientKey, "client-key", "", "client key for TLS (default $NOMAD_CLIENT_KEY)")

	if f.Nomad == nil {
		var cached nomadapi.API
		f.Nomad = func() (nomadapi.API, error) {
			if cached != nil {
				return cached, nil
			}
			c, err := nomadapi.New(o)
			cached = c
			return c, err
		}
	}
	if f.Consul == nil {
		var cached *consul.Client
		f.Consul = func() (*consul.Client, error) {
			if cached != nil {
				return cached, nil
			}
			c, err := consul.NewClient(consul.DefaultConfig())
			if err != nil {
				return nil, fmt.Errorf("consul client (CONSUL_HTTP_ADDR): %w", err)
			}
			cached = c
			return c, nil
		}
	}
	if f.Namespace == nil {
		f.Namespace = func() string {
			switch {
			case o.Namespace != "":
				return o.Namespace
			case os.Getenv("NOMAD_NAMESPACE") != "":
				return os.Getenv("NOMAD_NAMESPACE")
			}
			return "default"
		}
	}
	for _, sub := range []func(*factory.Factory) *cobra.Command{
		submit.NewCmd, render.NewCmd, validate.NewCmd, status.NewCmd, logs.NewCmd,
		stop.NewCmd, list.NewCmd, gpus.NewCmd, sweep.NewCmd, service.NewCmd, token.NewCmd, gateway.NewCmd, exporter.NewCmd,
		top.NewCmd, acl.NewCmd,
	} {
		c := sub(f)
		explainDenied(c)
		cmd.AddCommand(c)
	}
	return cmd
}

// explainDenied makes a command's ACL refusals name everything the command
// needs (nomadapi.ForCommand), not only the rule of the request Nomad
// refused first.
func explainDenied(c *cobra.Command) {
	run := c.RunE
	if run == nil {
		return
	}
	c.RunE = func(cmd *cobra.Command, args []string) error {
		return nomadapi.ForCommand(cmd.Name(), run(cmd, args))
	}
}
