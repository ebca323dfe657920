package nomadapi

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// TaskAPI is how a task of a Nomad job reaches Nomad without a token or a
// TLS file of the node: its Task API socket, and its workload identity (a
// JWT) from the job's identity { file = true }, both in NOMAD_SECRETS_DIR.
// A client made with Options{Socket: socket, Token: identity} may read the
// Nomad variables of the task's own job (nomad/jobs/<job>).
func TaskAPI() (socket, identity string, err error) {
	secrets := os.Getenv("NOMAD_SECRETS_DIR")
	if secrets == "" {
		return "", "", fmt.Errorf("NOMAD_SECRETS_DIR is not set: this runs only as a Nomad task")
	}
	jwt, err := os.ReadFile(filepath.Join(secrets, "nomad_token"))
	if err != nil {
		return "", "", fmt.Errorf("reading the workload identity (the job's identity block gives it): %w", err)
	}
	socket = filepath.Join(secrets, "api.sock")
	if _, err := os.Stat(socket); err != nil {
		// Nomad skips the socket when its path is too long for one.
		return "", "", fmt.Errorf("the Task API socket: %w (a data_dir path too long for a unix socket?)", err)
	}
	return socket, strings.TrimSpace(string(jwt)), nil
}
