package gpujobs

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/internal/contract"
)

// AddSpecFlags adds the --var and --var-file flags every command that reads a
// training spec takes, and completes spec files for its argument.
func AddSpecFlags(cmd *cobra.Command, vars, varFiles *[]string) {
	cmd.Flags().StringArrayVar(vars, "var", nil, "set a spec variable (`key=value`), repeatable; wins over --var-file")
	cmd.Flags().StringArrayVar(varFiles, "var-file", nil, "read spec variables from an HCL `file`, repeatable; later files win")
	cmd.ValidArgsFunction = CompleteSpecFile
	_ = cmd.RegisterFlagCompletionFunc("var-file", CompleteSpecFile)
}

// EnvCheckpointRoot gives the commands that render a jobspec the clients'
// checkpoint root when --checkpoint-root does not.
const EnvCheckpointRoot = "GPUJOB_CHECKPOINT_ROOT"

// AddRenderFlags adds the flags of the commands that render a jobspec:
// --checkpoint-root.
func AddRenderFlags(cmd *cobra.Command, checkpointRoot *string) {
	cmd.Flags().StringVar(checkpointRoot, "checkpoint-root", "",
		"the gpujob driver's checkpoint_root on the clients, from which an image job's containers mount their checkpoints "+
			"(an absolute `dir`; default $"+EnvCheckpointRoot+", else "+contract.DefaultCheckpointRoot+")")
	_ = cmd.MarkFlagDirname("checkpoint-root")
}

// RenderOptions are the render settings from the --checkpoint-root flag's
// value (flag), else the environment.
func RenderOptions(flag string) (render.Options, error) {
	root, from := flag, "--checkpoint-root"
	if root == "" {
		root, from = os.Getenv(EnvCheckpointRoot), EnvCheckpointRoot
	}
	if _, err := render.CheckpointRoot(root); err != nil {
		return render.Options{}, fmt.Errorf("%s: %w", from, err)
	}
	return render.Options{CheckpointRoot: root}, nil
}

// CompleteSpecFile completes HCL and JSON files.
func CompleteSpecFile(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return []string{"hcl", "json"}, cobra.ShellCompDirectiveFilterFileExt
}
