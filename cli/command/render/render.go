// Package render is `gpujob render SPEC`: print the Nomad jobspec a training
// spec renders to, offline.
package render

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

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
	Output         string
	CheckpointRoot string
}

// NewCmd returns the render command.
func NewCmd(f *factory.Factory) *cobra.Command { return NewCmdWith(f, nil) }

// NewCmdWith is NewCmd running runF instead of the command when runF is not
// nil: a test checks the Options the arguments parse into without running.
func NewCmdWith(f *factory.Factory, runF func(context.Context, *Options) error) *cobra.Command {
	o := &Options{}
	cmd := &cobra.Command{
		Use:   "render SPEC",
		Short: "Print the Nomad jobspec a training spec renders to",
		Long: `Render reads the training spec SPEC and prints the Nomad jobspec (HCL2)
that gpujob submit would register: one group of "workers" allocations run
by the gpujob task driver, with the nvidia/gpu device request, the
rendezvous port, and the restart policy derived from max_failures. A spec
with an image renders each member as a docker-driver task with a gpujob
sidecar; its containers mount their checkpoints from the clients'
checkpoint root (--checkpoint-root, $GPUJOB_CHECKPOINT_ROOT), which must
be the gpujob driver's checkpoint_root there.

It needs no Nomad agent. Errors in the spec are printed as
file:line:col: error: … and nothing is rendered (exit 1). The output is
deterministic: the same spec and variables give the same bytes, so it can
be kept in version control or fed to nomad job run.`,
		Example: `  gpujob render jobspecs/examples/bert-finetune.hcl
  gpujob render --var workers=4 --var-file prod.hcl train.hcl
  gpujob render train.hcl -o train.nomad.hcl && nomad job run train.nomad.hcl`,
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
	cmd.Flags().StringVarP(&o.Output, "output", "o", "", "write the jobspec to `file` instead of standard output")
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
		return fmt.Errorf("%s: %s; nothing rendered", path, countErrors(diags.Errs()))
	}
	out, err := ro.Jobspec(t)
	if err != nil {
		return fmt.Errorf("rendering %s: %w", path, err)
	}
	if o.Output == "" || o.Output == "-" {
		_, err := f.IO.Out.Write(out)
		return err
	}
	return writeFile(o.Output, out)
}

// writeFile replaces path with data atomically (a rename), so a failed
// render never leaves half a jobspec behind.
func writeFile(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func countErrors(errs []error) string {
	if len(errs) == 1 {
		return "1 error"
	}
	return fmt.Sprintf("%d errors", len(errs))
}
