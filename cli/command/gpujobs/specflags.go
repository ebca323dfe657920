package gpujobs

import "github.com/spf13/cobra"

// AddSpecFlags adds the --var and --var-file flags every command that reads a
// training spec takes, and completes spec files for its argument.
func AddSpecFlags(cmd *cobra.Command, vars, varFiles *[]string) {
	cmd.Flags().StringArrayVar(vars, "var", nil, "set a spec variable (`key=value`), repeatable; wins over --var-file")
	cmd.Flags().StringArrayVar(varFiles, "var-file", nil, "read spec variables from an HCL `file`, repeatable; later files win")
	cmd.ValidArgsFunction = CompleteSpecFile
	_ = cmd.RegisterFlagCompletionFunc("var-file", CompleteSpecFile)
}

// CompleteSpecFile completes HCL and JSON files.
func CompleteSpecFile(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return []string{"hcl", "json"}, cobra.ShellCompDirectiveFilterFileExt
}
