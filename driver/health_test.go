package driver

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/plugins/drivers"

	"github.com/gpujob/gpujob/driver/supervisor"
)

func TestConsulHealthRidesOutShortOutages(t *testing.T) {
	down := errors.New("consul at 127.0.0.1:8500 is unreachable: connection refused")
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	type step struct {
		at     time.Duration
		err    error
		want   drivers.HealthState
		next   time.Duration
		inDesc string
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"never reached is unhealthy at once", []step{
			{0, down, drivers.HealthStateUnhealthy, fingerprintRetryPeriod, "unreachable"},
			{5 * time.Second, nil, drivers.HealthStateHealthy, fingerprintPeriod, drivers.DriverHealthy},
		}},
		{"a short outage after success stays healthy", []step{
			{0, nil, drivers.HealthStateHealthy, fingerprintPeriod, drivers.DriverHealthy},
			{30 * time.Second, down, drivers.HealthStateHealthy, fingerprintRetryPeriod, "unhealthy after 1m0s"},
			{80 * time.Second, down, drivers.HealthStateHealthy, fingerprintRetryPeriod, "unreachable for 50s"},
			{85 * time.Second, nil, drivers.HealthStateHealthy, fingerprintPeriod, drivers.DriverHealthy},
		}},
		{"an outage past the grace is unhealthy, recovery heals", []step{
			{0, nil, drivers.HealthStateHealthy, fingerprintPeriod, drivers.DriverHealthy},
			{10 * time.Second, down, drivers.HealthStateHealthy, fingerprintRetryPeriod, ""},
			{10*time.Second + consulOutageGrace, down, drivers.HealthStateUnhealthy, fingerprintRetryPeriod, "connection refused"},
			{15*time.Second + consulOutageGrace, nil, drivers.HealthStateHealthy, fingerprintPeriod, drivers.DriverHealthy},
			// A new outage gets a new grace.
			{20*time.Second + consulOutageGrace, down, drivers.HealthStateHealthy, fingerprintRetryPeriod, ""},
		}},
	}
	rejected := &supervisor.TokenRejectedError{Address: "127.0.0.1:8500", Reason: "ACL not found"}
	cases = append(cases, struct {
		name  string
		steps []step
	}{"a rejected token is unhealthy at once, with no grace", []step{
		{0, nil, drivers.HealthStateHealthy, fingerprintPeriod, drivers.DriverHealthy},
		{30 * time.Second, rejected, drivers.HealthStateUnhealthy, fingerprintRetryPeriod, "rejects the driver's token (ACL not found)"},
		{35 * time.Second, nil, drivers.HealthStateHealthy, fingerprintPeriod, drivers.DriverHealthy},
		// An outage after it still gets its grace.
		{40 * time.Second, down, drivers.HealthStateHealthy, fingerprintRetryPeriod, "unhealthy after 1m0s"},
	}})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var h consulHealth
			for i, s := range tc.steps {
				got, desc, next := h.observe(t0.Add(s.at), s.err)
				if got != s.want || next != s.next || !strings.Contains(desc, s.inDesc) {
					t.Fatalf("step %d (t+%s, err %v): got %s %q next %s, want %s containing %q next %s",
						i, s.at, s.err, got, desc, next, s.want, s.inDesc, s.next)
				}
			}
		})
	}
}
