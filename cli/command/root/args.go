package root

import (
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// NormalizeArgs lets long flags take one dash, as the nomad CLI's do
// (`-var k=v`, `-json`): an argument "-name" or "-name=value" whose name is a
// long flag of some command becomes "--name...". pflag would otherwise read
// it as a bundle of one-letter flags. Arguments after "--" are left alone.
func NormalizeArgs(cmd *cobra.Command, args []string) []string {
	long := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		add := func(f *pflag.Flag) { long[f.Name] = true }
		c.Flags().VisitAll(add)
		c.PersistentFlags().VisitAll(add)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(cmd)
	out := make([]string, 0, len(args))
	for i, a := range args {
		if a == "--" {
			return append(out, args[i:]...)
		}
		if len(a) > 2 && a[0] == '-' && a[1] != '-' {
			name, _, _ := strings.Cut(a[1:], "=")
			if len(name) > 1 && long[name] {
				a = "-" + a
			}
		}
		out = append(out, a)
	}
	return out
}
