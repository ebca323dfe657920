package sweep

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/iostreams"
)

// `sweep submit`'s arguments parse into SubmitOptions (through the runF
// seam: nothing runs).
func TestSubmitOptionsFromArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want SubmitOptions
	}{
		{[]string{"sweep.hcl"}, SubmitOptions{Path: "sweep.hcl"}},
		{[]string{"--var", "a=b", "--checkpoint-root", "/ckpt", "--controller-binary", "/usr/bin/gpujob", "--controller-user", "ctl",
			"--detach", "--json", "sweep.hcl"},
			SubmitOptions{Path: "sweep.hcl", Vars: []string{"a=b"}, CheckpointRoot: "/ckpt", ControllerBinary: "/usr/bin/gpujob",
				ControllerUser: "ctl", Detach: true, JSON: true}},
	} {
		io, _, _, _ := iostreams.Test()
		var got *SubmitOptions
		cmd := NewSubmitCmd(&factory.Factory{IO: io, Now: time.Now}, func(_ context.Context, o *SubmitOptions) error {
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
}
