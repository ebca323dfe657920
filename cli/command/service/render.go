package service

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/cmdutil"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/spec"
)

func newRenderCmd(f *factory.Factory) *cobra.Command {
	var vars, varFiles []string
	var route bool
	cmd := &cobra.Command{
		Use:   "render SPEC",
		Short: "Print the Nomad jobspec (or, with --route, the gateway route) a service spec becomes",
		Example: `  gpujob service render jobspecs/examples/serve-bert.hcl
  gpujob service render --route jobspecs/examples/serve-bert.hcl`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, files, diags := spec.LoadService(args[0], spec.Options{Vars: vars, VarFiles: varFiles})
			if diags.HasErrors() {
				fmt.Fprint(f.IO.ErrOut, spec.Format(diags, files))
				return &cmdutil.ExitError{Code: 1, Err: fmt.Errorf("%s: the spec has errors", args[0])}
			}
			ro := render.ServiceOptions{Namespace: f.Namespace()}
			if route {
				return gpujobs.PrintJSON(f.IO.Out, RouteOf(s, ro.ServiceNamespace(s)))
			}
			out, err := ro.ServiceJobspec(s)
			if err != nil {
				return err
			}
			_, err = f.IO.Out.Write(out)
			return err
		},
	}
	gpujobs.AddSpecFlags(cmd, &vars, &varFiles)
	cmd.Flags().BoolVar(&route, "route", false, "print the route the gateways follow (JSON) instead of the jobspec")
	return cmd
}
