package status

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/iostreams"
)

// The arguments parse into Options (through the runF seam: nothing runs).
func TestOptionsFromArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want Options
	}{
		{[]string{"bert"}, Options{Job: "bert"}},
		{[]string{"--json", "bert"}, Options{Job: "bert", JSON: true}},
	} {
		io, _, _, _ := iostreams.Test()
		var got *Options
		cmd := NewCmdWith(&factory.Factory{IO: io, Now: time.Now}, func(_ context.Context, o *Options) error {
			got = o
			return nil
		})
		cmd.SetArgs(tc.args)
		if err := cmd.Execute(); err != nil {
			t.Errorf("%q: %v", tc.args, err)
			continue
		}
		if got == nil || !reflect.DeepEqual(*got, tc.want) {
			t.Errorf("%q parsed into %+v, want %+v", tc.args, got, tc.want)
		}
	}
	io, _, _, _ := iostreams.Test()
	ran := false
	cmd := NewCmdWith(&factory.Factory{IO: io, Now: time.Now}, func(context.Context, *Options) error {
		ran = true
		return nil
	})
	cmd.SetArgs([]string{"a", "b"})
	cmd.SilenceErrors, cmd.SilenceUsage = true, true
	if err := cmd.Execute(); err == nil || ran {
		t.Errorf("bad arguments: error %v, ran %v; want an error before running", err, ran)
	}
}
