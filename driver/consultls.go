package driver

import (
	"fmt"

	"github.com/gpujob/gpujob/driver/supervisor"
)

// inlineConsulTLS replaces the Consul TLS file paths of a supervisor's spec
// with the files' contents, read here by the driver (which runs as the Nomad
// client's user). The supervisor runs as the task's user: handing it paths
// would need the client's certificate key readable by that user, and so by
// every task it runs. The spec file holds the token already and is kept
// where only the supervisor reads it (the task's private directory), so the
// key is no more exposed than the token.
func inlineConsulTLS(c *supervisor.ConsulSpec, readFile func(string) ([]byte, error)) error {
	for _, f := range []struct {
		field string
		path  *string
		pem   *string
	}{
		{"ca_file", &c.CAFile, &c.CAPEM},
		{"cert_file", &c.CertFile, &c.CertPEM},
		{"key_file", &c.KeyFile, &c.KeyPEM},
	} {
		if *f.path == "" {
			continue
		}
		b, err := readFile(*f.path)
		if err != nil {
			return fmt.Errorf("consul %s: %w", f.field, err)
		}
		*f.pem, *f.path = string(b), ""
	}
	return nil
}
