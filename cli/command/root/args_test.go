package root

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

func TestNormalizeArgs(t *testing.T) {
	root := &cobra.Command{Use: "gpujob"}
	root.PersistentFlags().String("address", "", "")
	sub := &cobra.Command{Use: "submit"}
	sub.Flags().StringArray("var", nil, "")
	sub.Flags().StringArray("var-file", nil, "")
	sub.Flags().BoolP("follow", "f", false, "")
	root.AddCommand(sub)

	cases := []struct{ in, want string }{
		{"submit -var a=1 -var-file v.hcl spec.hcl", "submit --var a=1 --var-file v.hcl spec.hcl"},
		{"-address=http://x:4646 submit -var=a=1", "--address=http://x:4646 submit --var=a=1"},
		{"submit -f --var b=2 -x spec", "submit -f --var b=2 -x spec"},
		{"submit spec -- -var", "submit spec -- -var"},
	}
	for _, c := range cases {
		got := strings.Join(NormalizeArgs(root, strings.Fields(c.in)), " ")
		if got != c.want {
			t.Errorf("%q → %q, want %q", c.in, got, c.want)
		}
	}
}
