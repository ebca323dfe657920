package service

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/iostreams"
)

// `service deploy`'s arguments parse into DeployOptions (through the runF
// seam: nothing runs).
func TestDeployOptionsFromArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want DeployOptions
	}{
		{[]string{"serve.hcl"}, DeployOptions{Path: "serve.hcl"}},
		{[]string{"--var", "version=v2", "--var-file", "v.hcl", "--detach", "--json", "--gateway", "http://gw:8080", "serve.hcl"},
			DeployOptions{Path: "serve.hcl", Vars: []string{"version=v2"}, VarFiles: []string{"v.hcl"}, Detach: true, JSON: true, Gateway: "http://gw:8080"}},
	} {
		io, _, _, _ := iostreams.Test()
		var got *DeployOptions
		cmd := NewDeployCmd(&factory.Factory{IO: io, Now: time.Now}, func(_ context.Context, o *DeployOptions) error {
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
