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
	"github.com/gpujob/gpujob/cli/command/queue"
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
		Example: `  gpujob train validate jobspecs/examples/bert-finetune.hcl
  gpujob train submit jobspecs/examples/bert-finetune.hcl
  gpujob train status bert-finetune
  gpujob train logs bert-finetune --rank 1 -f
  gpujob sweep submit jobspecs/examples/sweep-toy.hcl
  gpujob service deploy jobspecs/examples/serve-cpu.hcl
  gpujob queue status
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
	cmd.AddCommand(newTrainCmd(f))
	// Today's top-level spellings of the train verbs stay: `gpujob submit`
	// is `gpujob train submit`, built by the same constructor.
	for _, sub := range append(trainVerbs, gpus.NewCmd, sweep.NewCmd, service.NewCmd, token.NewCmd, gateway.NewCmd,
		exporter.NewCmd, top.NewCmd, acl.NewCmd, queue.NewCmd) {
		c := sub(f)
		explainDenied(c)
		cmd.AddCommand(c)
	}
	return cmd
}

// trainVerbs are the verbs of `gpujob train`, each also a top-level
// command of the same name.
var trainVerbs = []func(*factory.Factory) *cobra.Command{
	submit.NewCmd, status.NewCmd, logs.NewCmd, stop.NewCmd, list.NewCmd, render.NewCmd, validate.NewCmd,
}

// newTrainCmd is `gpujob train VERB`: the noun-verb spelling of the
// training commands, like `gpujob sweep submit` and `gpujob service deploy`.
func newTrainCmd(f *factory.Factory) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "train",
		Short: "Train models: submit a train spec, follow it, read its logs, stop it",
		Long: `A train spec names a command, the workers and the GPUs per worker; gpujob
renders it into a Nomad job the gpujob driver runs as one distributed
training group. Each verb is also a top-level command: gpujob train submit
is gpujob submit.`,
		Example: `  gpujob train validate jobspecs/examples/bert-finetune.hcl
  gpujob train submit jobspecs/examples/bert-finetune.hcl
  gpujob train status bert-finetune
  gpujob train logs bert-finetune --rank 1 -f
  gpujob train stop bert-finetune
  gpujob train list`,
		Args: cobra.NoArgs,
	}
	for _, sub := range trainVerbs {
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
