// Package validate is `gpujob validate SPEC`: check a training spec offline.
package validate

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/cmdutil"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/spec"
)

// Options is what the command's arguments and flags ask for.
type Options struct {
	// Path is the spec file (the argument).
	Path           string
	Vars           []string
	VarFiles       []string
	CheckpointRoot string
}

// NewCmd returns the validate command.
func NewCmd(f *factory.Factory) *cobra.Command { return NewCmdWith(f, nil) }

// NewCmdWith is NewCmd running runF instead of the command when runF is not
// nil: a test checks the Options the arguments parse into without running.
func NewCmdWith(f *factory.Factory, runF func(context.Context, *Options) error) *cobra.Command {
	o := &Options{}
	cmd := &cobra.Command{
		Use:   "validate SPEC",
		Short: "Check a training spec without submitting it",
		Long: `Validate reads the training spec SPEC with its variables, checks every
field (types, ranges, units, durations, required fields) and renders the
jobspec, without contacting Nomad. It prints "SPEC: ok (job NAME, W workers
× G GPUs)", or each problem as file:line:col: error: … with the source
line, and exits 1.

Whether the cluster has nodes big enough is checked by gpujob submit,
which asks Nomad.`,
		Example: `  gpujob validate jobspecs/examples/bert-finetune.hcl
  gpujob validate --var workers=8 --var-file prod.hcl train.hcl`,
		Args: cobra.ExactArgs(1),
		// A spec error is not a usage error; the root prints errors.
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Path = args[0]
			return cmdutil.Run(cmd.Context(), o, runF, func(context.Context) error { return run(f, o, o.Path) })
		},
	}
	gpujobs.AddSpecFlags(cmd, &o.Vars, &o.VarFiles)
	gpujobs.AddRenderFlags(cmd, &o.CheckpointRoot)
	return cmd
}

func run(f *factory.Factory, o *Options, path string) error {
	ro, err := gpujobs.RenderOptions(o.CheckpointRoot)
	if err != nil {
		return err
	}
	t, files, diags := spec.Load(path, spec.Options{Vars: o.Vars, VarFiles: o.VarFiles})
	if diags.HasErrors() {
		fmt.Fprint(f.IO.ErrOut, spec.Format(diags, files))
		n := len(diags.Errs())
		return fmt.Errorf("%s: %d %s", path, n, plural(n, "error", "errors"))
	}
	if _, err := ro.Jobspec(t); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	// Warnings (none today) are worth showing even when the spec is valid.
	if len(diags) > 0 {
		fmt.Fprint(f.IO.ErrOut, spec.Format(diags, files))
	}
	fmt.Fprintf(f.IO.Out, "%s: ok (job %s, %d %s × %d %s)\n", path, t.Name,
		t.Workers, plural(t.Workers, "worker", "workers"),
		t.GPUsPerWorker, plural(t.GPUsPerWorker, "GPU", "GPUs"))
	return nil
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
