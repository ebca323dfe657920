package driver

import (
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/nomad/plugins/drivers"

	"github.com/gpujob/gpujob/driver/supervisor"
)

// consulOutageGrace is how long the driver stays healthy while Consul does
// not answer, once it has answered before. Running supervisors ride out such
// an outage (they retry every request and their sessions survive a server
// restart or leader election), so the node can still take work that will be
// started once Consul is back. Reporting unhealthy at once would do harm:
// Nomad blocks evaluations on "missing drivers" and does not always retry
// them when the driver turns healthy again, so a short blip could leave new
// jobs queued for good.
const consulOutageGrace = 60 * time.Second

// fingerprintRetryPeriod replaces fingerprintPeriod while Consul does not
// answer, so that the driver turns healthy again soon after it is back.
const fingerprintRetryPeriod = 5 * time.Second

// consulHealth turns the results of successive Consul checks into the
// driver's health. It is not safe for concurrent use; the fingerprint loop
// owns it.
type consulHealth struct {
	everReached bool
	downSince   time.Time // zero while Consul answers
}

// observe records one check's result at now and returns the health to
// report, its description, and when to check next.
func (h *consulHealth) observe(now time.Time, err error) (drivers.HealthState, string, time.Duration) {
	if err == nil {
		h.everReached, h.downSince = true, time.Time{}
		return drivers.HealthStateHealthy, drivers.DriverHealthy, fingerprintPeriod
	}
	// Consul answered, and refused the token: no grace, since waiting
	// cannot fix it and every task placed here would fail its rendezvous.
	var rejected *supervisor.TokenRejectedError
	if errors.As(err, &rejected) {
		h.everReached, h.downSince = true, time.Time{}
		return drivers.HealthStateUnhealthy, err.Error(), fingerprintRetryPeriod
	}
	if h.downSince.IsZero() {
		h.downSince = now
	}
	down := now.Sub(h.downSince)
	if !h.everReached || down >= consulOutageGrace {
		return drivers.HealthStateUnhealthy, err.Error(), fingerprintRetryPeriod
	}
	return drivers.HealthStateHealthy,
		fmt.Sprintf("%s (unreachable for %s; running tasks retry, unhealthy after %s)",
			err, down.Round(time.Second), consulOutageGrace),
		fingerprintRetryPeriod
}
