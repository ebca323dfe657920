// Command nomad-device-gpujob is the gpujob Nomad device plugin. Nomad starts
// it from the client's plugin_dir; run by hand it only says so.
package main

import (
	log "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins"

	"github.com/gpujob/gpujob/device/gpu"
)

func main() {
	plugins.Serve(func(logger log.Logger) interface{} {
		return gpu.New(logger, gpu.DefaultLibrary)
	})
}
