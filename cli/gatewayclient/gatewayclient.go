// Package gatewayclient finds the gpujob gateway and reads its traffic
// figures, for `gpujob service` and `gpujob top`.
package gatewayclient

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/gpujob/gpujob/internal/servekv"
)

// EnvGateway is the gateway's address, for a service's endpoint URL and
// the traffic figures (--gateway).
const EnvGateway = "GPUJOB_GATEWAY_ADDR"

// DefaultGateway is the gateway `make dev` starts.
const DefaultGateway = "http://127.0.0.1:8080"

// EnvGatewayAdmin is the gateway's admin address (its /metrics and
// /-/stats; gpujob gateway run --admin-listen), for the traffic figures of
// `service status` (--gateway-admin) and of `gpujob top`.
const EnvGatewayAdmin = "GPUJOB_GATEWAY_ADMIN_ADDR"

// EnvGatewayAdminToken is the bearer token of a gateway's admin listener
// that asks for one.
const EnvGatewayAdminToken = "GPUJOB_GATEWAY_ADMIN_TOKEN"

// Addr is the gateway's URL: flag, else $GPUJOB_GATEWAY_ADDR, else
// DefaultGateway.
func Addr(flag string) string {
	return strings.TrimSuffix(firstOf(flag, os.Getenv(EnvGateway), DefaultGateway), "/")
}

// AdminAddr is the gateway's admin URL: flag, else
// $GPUJOB_GATEWAY_ADMIN_ADDR, else the gateway's host on the port after
// its own (where gpujob gateway render puts it; the admin listener is on
// loopback by default, so that works on the gateway's node).
func AdminAddr(flag, gateway string) string {
	if a := firstOf(flag, os.Getenv(EnvGatewayAdmin)); a != "" {
		return strings.TrimSuffix(a, "/")
	}
	u, err := url.Parse(gateway)
	if err != nil || u.Port() == "" {
		return gateway
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		return gateway
	}
	u.Host = net.JoinHostPort(u.Hostname(), strconv.Itoa(port+1))
	return strings.TrimSuffix(u.String(), "/")
}

// StatsAt reads the /-/stats of the gateway whose admin listener is at
// admin (AdminAddr), with $GPUJOB_GATEWAY_ADMIN_TOKEN when it is set:
// every service's figures of the last minute.
func StatsAt(ctx context.Context, admin string) (*servekv.GatewayStats, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, admin+"/-/stats", nil)
	if err != nil {
		return nil, err
	}
	if tok := os.Getenv(EnvGatewayAdminToken); tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("the gateway's admin listener at %s did not answer (set --gateway-admin or %s): %w", admin, EnvGatewayAdmin, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		hint := ""
		if resp.StatusCode == http.StatusUnauthorized {
			hint = " (set " + EnvGatewayAdminToken + " to its admin token)"
		}
		return nil, fmt.Errorf("the gateway's admin listener at %s answered %s to /-/stats%s", admin, resp.Status, hint)
	}
	var all servekv.GatewayStats
	if err := json.NewDecoder(resp.Body).Decode(&all); err != nil {
		return nil, fmt.Errorf("the gateway's /-/stats: %w", err)
	}
	return &all, nil
}

func firstOf(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}
