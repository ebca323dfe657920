package nomadapi

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestErrorsSayWhereAndWhatToCheck(t *testing.T) {
	forbidden := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "Permission denied", http.StatusForbidden)
	}))
	defer forbidden.Close()

	cases := []struct {
		name, addr string
		want       []string
	}{
		{"unreachable", "http://127.0.0.1:1", []string{"cannot reach Nomad at http://127.0.0.1:1", "NOMAD_ADDR"}},
		{"unauthorised", forbidden.URL, []string{"permission denied", "list-jobs", "NOMAD_TOKEN", forbidden.URL}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			api, err := New(Options{Address: c.addr})
			if err != nil {
				t.Fatal(err)
			}
			_, _, err = api.Jobs(nil)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestOptionsOverrideTheEnvironment(t *testing.T) {
	t.Setenv("NOMAD_ADDR", "http://10.0.0.1:4646")
	api, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if api.Address() != "http://10.0.0.1:4646" {
		t.Errorf("NOMAD_ADDR not used: %s", api.Address())
	}
	api, _ = New(Options{Address: "http://127.0.0.1:5646"})
	if api.Address() != "http://127.0.0.1:5646" {
		t.Errorf("--address did not win: %s", api.Address())
	}
}

func TestTLSFailuresSayWhatToCheck(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("[]")) })
	untrusted := httptest.NewTLSServer(ok)
	defer untrusted.Close()

	// A server that trusts nobody's client certificate: the handshake fails
	// on the agent's side (verify_https_client without a client certificate).
	wantsCert := httptest.NewUnstartedServer(ok)
	wantsCert.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: x509.NewCertPool()}
	wantsCert.StartTLS()
	defer wantsCert.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: wantsCert.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}

	plain := httptest.NewServer(ok)
	defer plain.Close()

	cases := []struct {
		name string
		opts Options
	}{
		{"untrusted server certificate", Options{Address: untrusted.URL}},
		{"no client certificate", Options{Address: wantsCert.URL, CACert: ca}},
		{"https to plain http", Options{Address: strings.Replace(plain.URL, "http://", "https://", 1)}},
		{"http to https", Options{Address: strings.Replace(untrusted.URL, "https://", "http://", 1)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, err := New(c.opts)
			if err != nil {
				t.Fatal(err)
			}
			_, _, err = a.Jobs(nil)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range []string{"TLS with Nomad at " + c.opts.Address + " failed", "NOMAD_CACERT", "NOMAD_CLIENT_CERT"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q lacks %q", err, w)
				}
			}
		})
	}
}
