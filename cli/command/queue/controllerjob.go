package queue

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/render"
)

// EnvControllerBinary names the gpujob binary the controller jobs run on
// the clients when --controller-binary does not (the sweep controllers'
// setting too).
const EnvControllerBinary = "GPUJOB_CONTROLLER_BINARY"

// controllerJob says how apply runs the admission controller.
type controllerJob struct {
	binary string // --controller-binary
	user   string // --controller-user
	count  int    // --controllers
}

// ensureController registers the admission controller's job unless it
// runs: absent, stopped or dead, it is registered (again) from what this
// CLI renders now; a running one is left as it is (leader election makes
// the job's own restarts and a second apply harmless). It says what it
// did on w.
func ensureController(f *factory.Factory, o controllerJob, w io.Writer) error {
	nomad, err := f.Nomad()
	if err != nil {
		return err
	}
	old, err := nomad.Job(render.QueueControllerJob)
	switch {
	case err == nil && !(old.Stop != nil && *old.Stop) && !(old.Status != nil && *old.Status == "dead"):
		fmt.Fprintf(w, "queue controller: job %s runs (%s)\n", render.QueueControllerJob, statusOf(old.Status))
		return nil
	case err != nil && !gpujobs.IsNotFound(err):
		return err
	}
	spec, err := controllerSpec(f, nomad, o, w)
	if err != nil {
		return err
	}
	src, err := render.QueueControllerJobspec(spec)
	if err != nil {
		return err
	}
	job, err := nomad.ParseHCL(string(src), "")
	if err != nil {
		return fmt.Errorf("parsing the queue controller's job: %w", err)
	}
	resp, err := nomad.Register(job)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "queue controller: registered job %s (evaluation %s; %s as %s)\n", render.QueueControllerJob,
		shortID(resp.EvalID), spec.Binary, firstOf(spec.User, render.DefaultQueueControllerUser(spec.Secrets)))
	return nil
}

func statusOf(s *string) string {
	if s == nil || *s == "" {
		return "pending"
	}
	return *s
}

func shortID(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

func firstOf(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

// controllerSpec is the controller's job as this CLI reaches the clusters:
// their addresses, and TLS files without secrets, never a token. On a
// cluster with ACLs, or where the CLI speaks TLS, the controller reads its
// tokens and Consul's TLS material from its variable instead (its user
// could not read the CLI's files), as the exporters and gateways do; apply
// warns when that variable is missing.
func controllerSpec(f *factory.Factory, nomad nomadapi.API, o controllerJob, w io.Writer) (render.QueueController, error) {
	bin, err := controllerBinary(o.binary)
	if err != nil {
		return render.QueueController{}, err
	}
	acl, err := nomad.ACLEnabled()
	if err != nil {
		return render.QueueController{}, err
	}
	secrets := acl || usesTLS()
	env := map[string]string{}
	for _, k := range []string{"CONSUL_HTTP_ADDR", "CONSUL_HTTP_SSL", "CONSUL_TLS_SERVER_NAME", "NOMAD_REGION"} {
		if v := os.Getenv(k); v != "" {
			env[k] = v
		}
	}
	if !secrets {
		env["NOMAD_ADDR"] = nomad.Address()
		for _, k := range []string{"CONSUL_CACERT", "CONSUL_CLIENT_CERT", "CONSUL_CLIENT_KEY", "NOMAD_CACERT", "NOMAD_CLIENT_CERT", "NOMAD_CLIENT_KEY"} {
			if v := os.Getenv(k); v != "" {
				env[k] = v
			}
		}
	} else if v, err := nomad.Variable(render.QueueControllerVariable); err == nil && v == nil {
		// Nomad answers "not found" too for a variable this token may not
		// read: the warning says both.
		fmt.Fprintf(w, "warning: queue controller: no variable %s, or this Nomad token may not read it: the controller reads its tokens there; "+
			"an operator puts them (nomad var put %s nomad_token=... consul_token=...; policies: gpujob acl policy nomad-queue-controller, "+
			"consul-queue-controller)\n", render.QueueControllerVariable, render.QueueControllerVariable)
	}
	spec := render.QueueController{Binary: bin, User: o.user, Count: o.count, Env: env, Secrets: secrets}
	if f.Namespace != nil {
		if ns := f.Namespace(); ns != "" && ns != "default" {
			spec.Namespace = ns
		}
	}
	return spec, nil
}

// usesTLS says whether this CLI reaches Nomad or Consul over TLS.
func usesTLS() bool {
	return strings.HasPrefix(os.Getenv("NOMAD_ADDR"), "https://") || strings.HasPrefix(os.Getenv("CONSUL_HTTP_ADDR"), "https://") ||
		strings.EqualFold(os.Getenv("CONSUL_HTTP_SSL"), "true") || os.Getenv("CONSUL_CACERT") != "" || os.Getenv("NOMAD_CACERT") != ""
}

// controllerBinary is --controller-binary, else $GPUJOB_CONTROLLER_BINARY,
// else this binary: the clients run the same path.
func controllerBinary(flag string) (string, error) {
	b, from := flag, "--controller-binary"
	if b == "" {
		b, from = os.Getenv(EnvControllerBinary), EnvControllerBinary
	}
	if b == "" {
		exe, err := os.Executable()
		if err != nil {
			return "", fmt.Errorf("finding this gpujob binary for the queue controller (set --controller-binary): %w", err)
		}
		return filepath.EvalSymlinks(exe)
	}
	if !filepath.IsAbs(b) {
		return "", fmt.Errorf("%s: %q is not an absolute path", from, b)
	}
	return b, nil
}
