package service

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/cmdutil"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/spec"
)

// RenderOptions is what `service render`'s arguments and flags ask for.
type RenderOptions struct {
	// Path is the spec file (the argument).
	Path           string
	Vars, VarFiles []string
	// Route prints the gateway route instead of the jobspec.
	Route bool
}

func newRenderCmd(f *factory.Factory) *cobra.Command { return NewRenderCmd(f, nil) }

// NewRenderCmd is the command running runF instead when runF is not nil: a
// test checks the Options the arguments parse into without running.
func NewRenderCmd(f *factory.Factory, runF func(context.Context, *RenderOptions) error) *cobra.Command {
	o := &RenderOptions{}
	cmd := &cobra.Command{
		Use:   "render SPEC",
		Short: "Print the Nomad jobspec (or, with --route, the gateway route) a service spec becomes",
		Example: `  gpujob service render jobspecs/examples/serve-bert.hcl
  gpujob service render --route jobspecs/examples/serve-bert.hcl`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Path = args[0]
			return cmdutil.Run(cmd.Context(), o, runF, func(context.Context) error { return runRender(f, o) })
		},
	}
	gpujobs.AddSpecFlags(cmd, &o.Vars, &o.VarFiles)
	cmd.Flags().BoolVar(&o.Route, "route", false, "print the route the gateways follow (JSON) instead of the jobspec")
	return cmd
}

func runRender(f *factory.Factory, o *RenderOptions) error {
	s, files, diags := spec.LoadService(o.Path, spec.Options{Vars: o.Vars, VarFiles: o.VarFiles})
	if diags.HasErrors() {
		fmt.Fprint(f.IO.ErrOut, spec.Format(diags, files))
		return &cmdutil.ExitError{Code: 1, Err: fmt.Errorf("%s: the spec has errors", o.Path)}
	}
	ro := render.ServiceOptions{Namespace: f.Namespace()}
	if o.Route {
		return gpujobs.PrintJSON(f.IO.Out, RouteOf(s, ro.ServiceNamespace(s)))
	}
	out, err := ro.ServiceJobspec(s)
	if err != nil {
		return fmt.Errorf("rendering service %s: %w", s.Name, err)
	}
	_, err = f.IO.Out.Write(out)
	return err
}
