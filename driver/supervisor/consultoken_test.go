package supervisor

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// testCA signs certificates for a fake Consul and its callers.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  string
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))}
}

// issue returns a certificate and key in PEM for 127.0.0.1.
func (ca *testCA) issue(t *testing.T, serial int64, usage x509.ExtKeyUsage) (string, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "leaf"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}))
}

// fakeConsul serves /v1/status/leader and /v1/acl/token/self over mutual
// TLS (client certificates of ca required) and records the tokens it saw.
func fakeConsul(t *testing.T, ca *testCA, self func(token string) (int, string)) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/status/leader", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`"127.0.0.1:8300"`))
	})
	mux.HandleFunc("/v1/acl/token/self", func(w http.ResponseWriter, r *http.Request) {
		code, body := self(r.Header.Get("X-Consul-Token"))
		w.WriteHeader(code)
		_, _ = w.Write([]byte(body))
	})
	srv := httptest.NewUnstartedServer(mux)
	certPEM, keyPEM := ca.issue(t, 2, x509.ExtKeyUsageServerAuth)
	pair, err := tls.X509KeyPair([]byte(certPEM), []byte(keyPEM))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// The supervisor reaches a Consul that demands client certificates with the
// CA, certificate and key given inline (as the driver passes them), and the
// driver's health check tells a rejected token from an unreachable Consul.
func TestCheckConsulOverMutualTLSAndTokens(t *testing.T) {
	ca := newTestCA(t)
	const good = "3f1e2d4c-0000-4000-8000-000000000001"
	srv := fakeConsul(t, ca, func(token string) (int, string) {
		if token == good {
			return http.StatusOK, `{"AccessorID":"a","Description":"gpujob task driver"}`
		}
		return http.StatusForbidden, "ACL not found"
	})
	addr := strings.TrimPrefix(srv.URL, "https://")
	certPEM, keyPEM := ca.issue(t, 3, x509.ExtKeyUsageClientAuth)
	spec := ConsulSpec{Address: addr, Scheme: "https", CAPEM: ca.pem, CertPEM: certPEM, KeyPEM: keyPEM}
	ctx := context.Background()

	spec.Token = good
	if err := CheckConsul(ctx, spec); err != nil {
		t.Fatalf("a good token over mutual TLS: %v", err)
	}

	spec.Token = "forged-0000-4000-8000-000000000002"
	err := CheckConsul(ctx, spec)
	var rejected *TokenRejectedError
	if !errors.As(err, &rejected) || !strings.Contains(err.Error(), "ACL not found") {
		t.Fatalf("a forged token: got %v, want a TokenRejectedError", err)
	}
	if strings.Contains(err.Error(), spec.Token) {
		t.Errorf("the error shows the token: %v", err)
	}

	// Without a client certificate the handshake fails: the check must not
	// pass for a Consul it cannot actually use.
	noCert := spec
	noCert.Token, noCert.CertPEM, noCert.KeyPEM = good, "", ""
	if err := CheckConsul(ctx, noCert); err == nil || errors.As(err, &rejected) {
		t.Errorf("no client certificate: got %v, want an unreachable error", err)
	}
	// Nor with a CA that did not sign the server's certificate.
	other := newTestCA(t)
	wrongCA := spec
	wrongCA.Token, wrongCA.CAPEM = good, other.pem
	if err := CheckConsul(ctx, wrongCA); err == nil {
		t.Error("a server certificate of another CA was accepted")
	}
}

func TestCheckConsulWithoutACLs(t *testing.T) {
	ca := newTestCA(t)
	srv := fakeConsul(t, ca, func(string) (int, string) { return http.StatusUnauthorized, "ACL support disabled" })
	certPEM, keyPEM := ca.issue(t, 3, x509.ExtKeyUsageClientAuth)
	spec := ConsulSpec{Address: strings.TrimPrefix(srv.URL, "https://"), Scheme: "https", Token: "t",
		CAPEM: ca.pem, CertPEM: certPEM, KeyPEM: keyPEM}
	if err := CheckConsul(context.Background(), spec); err != nil {
		t.Errorf("a token given to a Consul without ACLs: %v", err)
	}
}
