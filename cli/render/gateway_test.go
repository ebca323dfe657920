package render

import (
	"strings"
	"testing"
)

func TestGatewayJobspecPutsTheAdminListenerOnLoopback(t *testing.T) {
	b, err := GatewayJobspec(Gateway{Binary: "/usr/local/bin/gpujob", Port: 18080})
	if err != nil {
		t.Fatal(err)
	}
	out := string(b)
	for _, want := range []string{
		`port "admin" {`, "static = 18081",
		`"--listen", "${NOMAD_ADDR_http}", "--admin-listen", "127.0.0.1:${NOMAD_PORT_admin}"`,
		`name     = "gpujob-gateway-admin"`, `tags     = ["loopback"]`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	b, err = GatewayJobspec(Gateway{Binary: "/usr/local/bin/gpujob", AdminPort: 9100, AdminPublic: true, Secrets: true})
	if err != nil {
		t.Fatal(err)
	}
	if out := string(b); !strings.Contains(out, `"--admin-listen", "${NOMAD_ADDR_admin}"`) || !strings.Contains(out, "static = 9100") {
		t.Errorf("--admin-public --admin-port 9100:\n%s", out)
	}
	if _, err := GatewayJobspec(Gateway{Binary: "/usr/local/bin/gpujob", AdminPublic: true}); err == nil || !strings.Contains(err.Error(), "--admin-public needs --secrets") {
		t.Errorf("--admin-public without --secrets: %v", err)
	}
	if _, err := GatewayJobspec(Gateway{Binary: "/usr/local/bin/gpujob", Port: 9000, AdminPort: 9000}); err == nil || !strings.Contains(err.Error(), "--admin-port") {
		t.Errorf("the admin port on the gateway's: %v", err)
	}
}

// raw_exec hands a task the agent's environment: the gateway's job blanks
// every token variable (it reads its own from its variable with --secrets),
// as the exporter's does.
func TestGatewayJobspecBlanksTheAgentsTokens(t *testing.T) {
	for _, secrets := range []bool{false, true} {
		b, err := GatewayJobspec(Gateway{Binary: "/usr/local/bin/gpujob", Port: 18080, Secrets: secrets})
		if err != nil {
			t.Fatal(err)
		}
		out := string(b)
		for _, want := range []string{`NOMAD_TOKEN `, `CONSUL_HTTP_TOKEN `, `CONSUL_HTTP_TOKEN_FILE `, `CONSUL_HTTP_AUTH `} {
			i := strings.Index(out, want)
			if i < 0 || !strings.HasPrefix(strings.TrimLeft(out[i+len(want):], " "), `= ""`) {
				t.Errorf("secrets=%t: %s is not blanked in:\n%s", secrets, strings.TrimSpace(want), out)
			}
		}
		if got := strings.Contains(out, "GPUJOB_GATEWAY_SECRETS") && strings.Contains(out, "identity {"); got != secrets {
			t.Errorf("secrets=%t: the variable and identity are there: %t", secrets, got)
		}
	}
}
