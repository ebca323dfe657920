package root

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/iostreams"
	"github.com/gpujob/gpujob/cli/nomadapi"
)

const exampleSpec = "../../../jobspecs/examples/cpu-smoke.hcl"

// flagsOf describes a command's own flags: name, shorthand, type, default
// and usage.
func flagsOf(c *cobra.Command) string {
	var b strings.Builder
	c.Flags().VisitAll(func(f *pflag.Flag) {
		b.WriteString(f.Name + "/" + f.Shorthand + "/" + f.Value.Type() + "/" + f.DefValue + "/" + f.Usage + "\n")
	})
	return b.String()
}

// Every train verb has its top-level alias, and both spellings are the
// same command: same usage, help, examples and flags.
func TestTrainVerbsKeepTheirTopLevelSpelling(t *testing.T) {
	io, _, _, _ := iostreams.Test()
	cmd := NewCmd(&factory.Factory{IO: io, Now: time.Now})
	train, _, err := cmd.Find([]string{"train"})
	if err != nil || train.Name() != "train" {
		t.Fatalf("no train command: %v", err)
	}
	verbs := []string{"submit", "status", "logs", "stop", "list", "render", "validate"}
	if len(train.Commands()) != len(verbs) {
		t.Errorf("train has %d verbs, want %v", len(train.Commands()), verbs)
	}
	for _, v := range verbs {
		nv, _, err := cmd.Find([]string{"train", v})
		if err != nil || nv.Name() != v {
			t.Errorf("gpujob train %s: %v", v, err)
			continue
		}
		top, _, err := cmd.Find([]string{v})
		if err != nil || top.Name() != v || top.Parent() != cmd {
			t.Errorf("gpujob %s: %v", v, err)
			continue
		}
		if nv.Use != top.Use || nv.Short != top.Short || nv.Long != top.Long || nv.Example != top.Example {
			t.Errorf("%s: the two spellings' help differs", v)
		}
		if nv.Example == "" {
			t.Errorf("gpujob train %s --help has no examples", v)
		}
		if a, b := flagsOf(nv), flagsOf(top); a != b {
			t.Errorf("%s: flags differ:\ntrain %s:\n%s\n%s:\n%s", v, v, a, v, b)
		}
		if nv.RunE == nil {
			t.Errorf("gpujob train %s runs nothing", v)
		}
	}
}

// Both spellings behave the same: the same output and error for the same
// arguments.
func TestTrainVerbsBehaveAsTheirAliases(t *testing.T) {
	for _, args := range [][]string{
		{"validate", exampleSpec},
		{"render", exampleSpec},
		{"render", "-var", "workers=1", exampleSpec},
		{"validate", "does-not-exist.hcl"},
		{"list"},
		{"status", "nope"},
		{"stop", "nope"},
	} {
		run := func(args []string) (string, string) {
			io, _, out, errOut := iostreams.Test()
			fake := nomadapi.NewFake()
			f := &factory.Factory{IO: io, Now: func() time.Time { return time.Unix(1.7e9, 0) },
				Nomad: func() (nomadapi.API, error) { return fake, nil }}
			cmd := NewCmd(f)
			cmd.SetArgs(NormalizeArgs(cmd, args))
			cmd.SetOut(out)
			cmd.SetErr(errOut)
			err := cmd.Execute()
			msg := "<nil>"
			if err != nil {
				msg = err.Error()
			}
			return out.String() + errOut.String(), msg
		}
		topOut, topErr := run(args)
		nvOut, nvErr := run(append([]string{"train"}, args...))
		if topOut != nvOut || topErr != nvErr {
			t.Errorf("%v: gpujob %s printed %q (error %s); gpujob train %s printed %q (error %s)",
				args, args[0], topOut, topErr, args[0], nvOut, nvErr)
		}
		if topOut == "" && topErr == "<nil>" {
			t.Errorf("%v: no output and no error: the comparison compared nothing", args)
		}
	}
}
