package driver

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpujob/gpujob/driver/supervisor"
)

func TestInlineConsulTLSReplacesPathsWithContents(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	c := supervisor.ConsulSpec{
		Address: "127.0.0.1:8501", Scheme: "https", Token: "tok",
		CAFile: write("ca.pem", "CA"), CertFile: write("cli.pem", "CERT"), KeyFile: write("cli-key.pem", "KEY"),
	}
	if err := inlineConsulTLS(&c, os.ReadFile); err != nil {
		t.Fatal(err)
	}
	if c.CAPEM != "CA" || c.CertPEM != "CERT" || c.KeyPEM != "KEY" {
		t.Errorf("contents not inlined: %+v", c)
	}
	if c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" {
		t.Errorf("paths left in the spec (the supervisor may not be able to read them): %+v", c)
	}

	// No TLS: nothing to read.
	plain := supervisor.ConsulSpec{Address: "127.0.0.1:8500"}
	if err := inlineConsulTLS(&plain, func(string) ([]byte, error) { t.Fatal("read a file"); return nil, nil }); err != nil {
		t.Fatal(err)
	}

	// A file that cannot be read fails the task start, naming the setting.
	bad := supervisor.ConsulSpec{KeyFile: filepath.Join(dir, "missing-key.pem")}
	err := inlineConsulTLS(&bad, os.ReadFile)
	if err == nil || !strings.Contains(err.Error(), "key_file") {
		t.Errorf("got %v, want an error naming key_file", err)
	}
}
