// Package cmdtest checks how a command's arguments parse into its Options,
// through the runF seam of gpujob's commands (NewCmdWith): the command's
// flags and argument checks run, the command does not.
package cmdtest

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/iostreams"
)

// NewCmd is a command constructor with a runF seam.
type NewCmd[O any] func(f *factory.Factory, runF func(context.Context, *O) error) *cobra.Command

// Case is arguments and the Options they parse into.
type Case[O any] struct {
	Args []string
	Want O
}

// Parse runs the command newCmd builds with args and returns the Options
// runF received, nil when runF was not reached (then err says why).
func Parse[O any](newCmd NewCmd[O], args []string) (*O, error) {
	io, _, _, _ := iostreams.Test()
	var got *O
	cmd := newCmd(&factory.Factory{IO: io, Now: time.Now}, func(_ context.Context, o *O) error {
		got = o
		return nil
	})
	cmd.SetArgs(args)
	cmd.SilenceErrors, cmd.SilenceUsage = true, true
	cmd.SetOut(io.Out)
	cmd.SetErr(io.ErrOut)
	err := cmd.Execute()
	return got, err
}

// CheckOptions checks that each case's arguments parse into its Options,
// and that each of bad is refused before the command would run.
func CheckOptions[O any](t *testing.T, newCmd NewCmd[O], cases []Case[O], bad ...[]string) {
	t.Helper()
	for _, tc := range cases {
		got, err := Parse(newCmd, tc.Args)
		if err != nil {
			t.Errorf("%q: %v", tc.Args, err)
			continue
		}
		if got == nil || !reflect.DeepEqual(*got, tc.Want) {
			t.Errorf("%q parsed into %+v, want %+v", tc.Args, got, tc.Want)
		}
	}
	for _, args := range bad {
		if got, err := Parse(newCmd, args); err == nil || got != nil {
			t.Errorf("%q: error %v, ran with %+v; want an error before running", args, err, got)
		}
	}
}

// Refusal is arguments a command refuses before it runs, and a part of
// the error users see for them.
type Refusal struct {
	Args []string
	Err  string
}

// CheckRefusals checks that each refusal's arguments are refused before
// the command would run, with an error that says what its Err says.
func CheckRefusals[O any](t *testing.T, newCmd NewCmd[O], refusals ...Refusal) {
	t.Helper()
	for _, r := range refusals {
		got, err := Parse(newCmd, r.Args)
		switch {
		case got != nil:
			t.Errorf("%q ran with %+v; want it refused: %s", r.Args, got, r.Err)
		case err == nil || !strings.Contains(err.Error(), r.Err):
			t.Errorf("%q: error %v, want one saying %q", r.Args, err, r.Err)
		}
	}
}
