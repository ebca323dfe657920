package root

import (
	"strings"
	"testing"
	"time"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/iostreams"
	"github.com/gpujob/gpujob/cli/nomadapi"
)

// A refusal names what the whole command needs, whichever of its requests
// Nomad refused first.
func TestRefusalNamesWhatTheCommandNeeds(t *testing.T) {
	cases := []struct {
		args   []string
		method string
		need   nomadapi.Need
		want   string
	}{
		{[]string{"list"}, "Jobs", nomadapi.Need{Namespace: "default", Capability: nomadapi.CapListJobs},
			`set NOMAD_TOKEN to a token whose policy grants it`},
		{[]string{"gpus"}, "Nodes", nomadapi.Need{Node: "read"},
			`gpujob gpus needs the read-job capability in namespace "default" and node read`},
		{[]string{"status", "bert"}, "Job", nomadapi.Need{Namespace: "default", Capability: nomadapi.CapReadJob},
			`gpujob status needs the read-job and read-logs capabilities in namespace "default"`},
		{[]string{"stop", "bert"}, "Job", nomadapi.Need{Namespace: "default", Capability: nomadapi.CapReadJob},
			`gpujob stop needs the submit-job and read-job capabilities in namespace "default"`},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			fake := nomadapi.NewFake()
			fake.Fail(c.method, &nomadapi.PermissionError{Op: "x", Need: c.need, Address: fake.Address()})
			io, _, _, _ := iostreams.Test()
			f := &factory.Factory{IO: io, Now: time.Now, Nomad: func() (nomadapi.API, error) { return fake, nil }}
			cmd := NewCmd(f)
			cmd.SetArgs(c.args)
			err := cmd.Execute()
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range []string{"permission denied: this needs " + c.need.String(), c.want, "set NOMAD_TOKEN"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q lacks %q", err, w)
				}
			}
		})
	}
}
