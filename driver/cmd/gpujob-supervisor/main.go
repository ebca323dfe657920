// Command gpujob-supervisor is the supervisor alone, built static
// (CGO_ENABLED=0) so that it runs in any container image: the gpujob driver
// copies it into a container member's run directory, which the docker task
// mounts read-only at /gpujob, and the container runs
// `/gpujob/supervisor /gpujob/spec.json` (see driver/container.go). Host
// members run the same code from the plugin binary instead.
package main

import (
	"fmt"
	"os"

	"github.com/gpujob/gpujob/driver/supervisor"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == supervisor.RunAsCommand {
		os.Exit(supervisor.RunAsMain(os.Args[2:]))
	}
	if len(os.Args) != 2 || os.Args[1] == "" || os.Args[1][0] == '-' {
		fmt.Fprintf(os.Stderr, "usage: %s SPEC\n  runs a gpujob member's supervisor from the spec the gpujob driver wrote\n", os.Args[0])
		os.Exit(2)
	}
	os.Exit(supervisor.Main(os.Args[1]))
}
