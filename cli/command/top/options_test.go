package top

import (
	"testing"
	"time"

	"github.com/gpujob/gpujob/cli/cmdutil/cmdtest"
)

// The arguments parse into Options (through the runF seam: nothing runs).
func TestOptionsFromArgs(t *testing.T) {
	cmdtest.CheckOptions(t, NewCmdWith, []cmdtest.Case[Options]{
		{Args: []string{}, Want: Options{Interval: 2 * time.Second}},
		{Args: []string{"--interval", "5s", "--once", "--gateway", "http://gw:8080", "--gateway-admin", "http://gw:8081"},
			Want: Options{Interval: 5 * time.Second, Once: true, Gateway: "http://gw:8080", GatewayAdmin: "http://gw:8081"}},
		{Args: []string{"--json"}, Want: Options{Interval: 2 * time.Second, JSON: true}},
	}, []string{"--interval", "soon"})
}
