// Command nomad-driver-gpujob is the gpujob Nomad task driver. Nomad starts it
// from the client's plugin_dir; the driver runs the same binary again, through
// Nomad's executor, as each task's supervisor ("supervise SPEC"), and as the
// executor itself (the "executor" argument, handled by Nomad's executor
// package on import).
package main

import (
	"fmt"
	"os"

	log "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins"

	"github.com/gpujob/gpujob/driver"
	"github.com/gpujob/gpujob/driver/supervisor"
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == driver.SuperviseCommand {
		os.Exit(supervisor.Main(os.Args[2]))
	}
	if len(os.Args) > 1 && os.Args[1] == supervisor.RunAsCommand {
		os.Exit(supervisor.RunAsMain(os.Args[2:]))
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "nomad-driver-gpujob: locating its own binary: %v\n", err)
		os.Exit(1)
	}
	plugins.Serve(func(logger log.Logger) interface{} {
		return driver.New(logger, self)
	})
}
