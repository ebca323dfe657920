package service

import (
	"fmt"
	"io"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/servicedeploy"
)

// progressTo prints each deployment change on a line of its own (not
// with -json).
func progressTo(out io.Writer, asJSON bool) func(*api.Deployment) {
	return func(d *api.Deployment) {
		if !asJSON {
			fmt.Fprintln(out, servicedeploy.DeploymentLine(d))
		}
	}
}
