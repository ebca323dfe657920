// Package acl is `gpujob acl`: the ACL policies of gpujob's users and
// components for Nomad and Consul (jobspecs/acl), the per-namespace ones
// rendered for a namespace.
package acl

import (
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/servestore"
	"github.com/gpujob/gpujob/cli/sweepjob"
	policies "github.com/gpujob/gpujob/jobspecs/acl"
)

// NewCmd returns the acl command and its subcommands.
func NewCmd(f *factory.Factory) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "acl",
		Short: "Print the Nomad and Consul ACL policies of gpujob's users and components",
		Long: `gpujob's users and components each need a Nomad or Consul ACL policy. Those of
a namespace's users are per namespace: a user of one namespace must never write
another namespace's sweeps (whose trial templates that namespace's controller
registers) or services (whose routes the gateways follow and the autoscaler
scales). gpujob acl policy prints each policy, rendered for a namespace where it
is one's.`,
		Example: `  gpujob acl policy
  gpujob acl policy nomad-submit --namespace team-a`,
	}
	cmd.AddCommand(newPolicyCmd(f))
	return cmd
}

type policyOptions struct {
	readOnly                   bool
	sweepPrefix, servicePrefix string
}

func newPolicyCmd(f *factory.Factory) *cobra.Command {
	o := &policyOptions{}
	cmd := &cobra.Command{
		Use:   "policy [NAME]",
		Short: "Print an ACL policy (the list of them without NAME)",
		Long: `Policy prints the rules of the ACL policy NAME, for the namespace --namespace
(default $NOMAD_NAMESPACE, else "default") where it is a namespace's, ready for
consul acl policy create -rules - or nomad acl policy apply NAME -. Without
NAME it lists the policies.

A namespace's user holds nomad-submit (or nomad-readonly) for Nomad and
consul-sweeps and consul-services for Consul, each rendered for that
namespace. The Consul ones write only <prefix>/<namespace>/ (the trailing slash
keeps a namespace whose name extends another's apart); consul-services also
reads every namespace's routes, for the check that no two services take one
path. --read-only renders the Consul ones read only. consul-queues is the
queue configuration's: as is for those who apply queue files, --read-only for
users (submit's queue check). The queue admission controller holds
nomad-queue-controller and consul-queue-controller, from the Nomad variable
nomad/jobs/gpujob-queue-controller (items nomad_token and consul_token), as
the exporters and the gateways hold theirs.

--sweep-prefix and --service-prefix (default $GPUJOB_SWEEP_KEY_PREFIX and
$GPUJOB_SERVICE_KEY_PREFIX, else gpujob/sweeps and gpujob/services) must be
the prefixes the driver, the CLI and the gateways use.`,
		Example: `  gpujob acl policy
  gpujob acl policy consul-sweeps --namespace team-a | consul acl policy create -name gpujob-sweeps-team-a -rules -
  gpujob acl policy consul-services --namespace team-a | consul acl policy create -name gpujob-services-team-a -rules -
  gpujob acl policy nomad-submit --namespace team-a | nomad acl policy apply gpujob-submit-team-a -`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return list(f)
			}
			pol, err := policies.Lookup(args[0])
			if err != nil {
				return err
			}
			p := policies.Params{ReadOnly: o.readOnly, SweepPrefix: o.sweepPrefix, ServicePrefix: o.servicePrefix}
			if pol.PerNamespace {
				p.Namespace = f.Namespace()
			}
			out, err := policies.Render(pol, p)
			if err != nil {
				return err
			}
			_, err = f.IO.Out.Write(out)
			return err
		},
	}
	cmd.Flags().BoolVar(&o.readOnly, "read-only", false, "render the namespace's keys read only (consul-sweeps, consul-services)")
	cmd.Flags().StringVar(&o.sweepPrefix, "sweep-prefix", os.Getenv(sweepjob.EnvKeyPrefix), "the sweeps' Consul KV `prefix`")
	cmd.Flags().StringVar(&o.servicePrefix, "service-prefix", os.Getenv(servestore.EnvKeyPrefix), "the services' Consul KV `prefix`")
	return cmd
}

func list(f *factory.Factory) error {
	w := tabwriter.NewWriter(f.IO.Out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tFOR\tFILE")
	for _, p := range policies.Policies() {
		who := p.Summary
		if p.PerNamespace {
			who += " (per namespace)"
		}
		fmt.Fprintf(w, "%s\t%s\tjobspecs/acl/%s\n", p.Name, who, p.File)
	}
	return w.Flush()
}
