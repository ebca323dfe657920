package supervisor

import (
	"fmt"
	"io"
	"time"

	"github.com/gpujob/gpujob/internal/errlog"
)

// consulLogEvery bounds how often the rendezvous's retry messages reach the
// task's stderr: during a Consul outage every outstanding request retries
// every couple of seconds, and the user needs to see that it is happening,
// not every attempt.
const consulLogEvery = 5 * time.Second

// consulLog is the rendezvous's log: lines on out, prefixed so that a user
// reading the task's stderr knows where they come from, at most one per
// consulLogEvery (errlog.Throttled).
func consulLog(out io.Writer) func(format string, args ...any) {
	return errlog.NewThrottled(func(format string, args ...any) {
		fmt.Fprintf(out, "gpujob: consul: "+format+"\n", args...)
	}, consulLogEvery).Logf
}
