// Package factory builds what commands depend on — the Nomad API and the IO
// streams — so a test can hand a command a fake API and buffers.
package factory

import (
	"time"

	"github.com/gpujob/gpujob/cli/iostreams"
	"github.com/gpujob/gpujob/cli/nomadapi"
)

// Factory is passed to every command's constructor.
type Factory struct {
	IO *iostreams.IOStreams
	// Nomad returns the API client, built from the global flags and the
	// NOMAD_* environment when first asked.
	Nomad func() (nomadapi.API, error)
	// Now is the clock (tests pin it).
	Now func() time.Time
}
