package gatewayclient

import "testing"

func TestAdminAddr(t *testing.T) {
	t.Setenv(EnvGatewayAdmin, "")
	for _, c := range []struct{ flag, gw, want string }{
		{"", "http://127.0.0.1:8080", "http://127.0.0.1:8081"},
		{"", "http://gw.example.com:18080/", "http://gw.example.com:18081"},
		{"http://127.0.0.1:9000/", "http://127.0.0.1:8080", "http://127.0.0.1:9000"},
		{"", "http://gw.example.com", "http://gw.example.com"},
	} {
		if got := AdminAddr(c.flag, c.gw); got != c.want {
			t.Errorf("AdminAddr(%q, %q) = %q, want %q", c.flag, c.gw, got, c.want)
		}
	}
	t.Setenv(EnvGatewayAdmin, "http://10.0.0.5:8081")
	if got := AdminAddr("", "http://127.0.0.1:8080"); got != "http://10.0.0.5:8081" {
		t.Errorf("with $%s: %q", EnvGatewayAdmin, got)
	}
}
