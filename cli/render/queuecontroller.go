package render

import (
	"fmt"
	"path/filepath"

	"github.com/zclconf/go-cty/cty"

	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/ctyval"
)

// The queue admission controller's job.
const (
	QueueControllerJob   = "gpujob-queue-controller"
	QueueControllerGroup = "controller"
	// QueueControllerTask is short: its Task API socket,
	// <data_dir>/alloc/<alloc ID>/<task>/secrets/api.sock, must fit the
	// 107 bytes of a unix socket's path.
	QueueControllerTask = "qctl"
)

// QueueControllerVariable is the Nomad variable a queue controller job with
// Secrets reads: its own job's path, which its tasks may read without any
// policy.
const QueueControllerVariable = "nomad/jobs/" + QueueControllerJob

// EnvQueueControllerSecrets names the variable a queue controller reads its
// credentials from (gpujob queue controller).
const EnvQueueControllerSecrets = "GPUJOB_QUEUE_CONTROLLER_SECRETS"

// DefaultQueueControllerUser is who the controller runs as: nobody, or,
// holding tokens (which may register jobs in every namespace), a user of
// its own, since the training ranks run as nobody and a process of the
// same user could read its identity file or reach its Task API socket.
func DefaultQueueControllerUser(secrets bool) string {
	if secrets {
		return "gpujob-queue"
	}
	return "nobody"
}

// QueueController describes the queue admission controller's job.
type QueueController struct {
	// Binary is the gpujob executable's absolute path on the clients.
	Binary string
	// Count controllers run (0 is 1); one leads, the others stand by.
	Count int
	// User runs it (raw_exec's user); empty: DefaultQueueControllerUser.
	User string
	// Env is how it reaches Nomad and Consul: addresses (and TLS files
	// without Secrets), never a token.
	Env         map[string]string
	Datacenters []string
	NodePool    string
	Namespace   string
	// Secrets has the controller read its tokens and Consul TLS material
	// from the Nomad variable QueueControllerVariable with its workload
	// identity, through its Task API socket (a cluster with ACLs or TLS):
	// EnvQueueControllerSecrets names it.
	Secrets bool
}

// QueueControllerJobspec renders the service job that runs the queue's
// admission controller (gpujob queue controller): raw_exec (a Go binary
// talking to Nomad's and Consul's APIs; it needs no GPU and no file of the
// node), restarted at once when it dies and rescheduled without limit when
// its node goes: its state is in Consul, and one elected leader acts, so a
// new controller resumes where the old left off and a second one is safe.
func QueueControllerJobspec(q QueueController) ([]byte, error) {
	if !filepath.IsAbs(q.Binary) {
		return nil, fmt.Errorf("render: the queue controller's gpujob binary %q is not an absolute path", q.Binary)
	}
	if q.Count < 0 || q.Count > 5 {
		return nil, fmt.Errorf("render: queue controller count %d: want 1 to 5 (one leads, the others stand by)", q.Count)
	}
	f, job := helperJob("# Rendered by `gpujob queue apply`: the queue admission controller.\n",
		QueueControllerJob, "service", q.Datacenters, q.Namespace, q.NodePool)
	job.SetAttributeValue("meta", ctyval.StringMap(map[string]string{contract.MetaKind: contract.KindQueueController}))
	job.AppendNewline()

	group := job.AppendNewBlock("group", []string{QueueControllerGroup}).Body()
	group.SetAttributeValue("count", cty.NumberIntVal(int64(max(q.Count, 1))))
	group.AppendNewline()
	controllerRestarts(group)

	task := group.AppendNewBlock("task", []string{QueueControllerTask}).Body()
	task.SetAttributeValue("driver", cty.StringVal("raw_exec"))
	task.SetAttributeValue("user", cty.StringVal(firstNonEmpty(q.User, DefaultQueueControllerUser(q.Secrets))))
	// SIGTERM: the controller resigns its leadership, so that a standby
	// leads at once.
	task.SetAttributeValue("kill_timeout", cty.StringVal("15s"))
	task.AppendNewline()
	config := task.AppendNewBlock("config", nil).Body()
	config.SetAttributeValue("command", cty.StringVal(q.Binary))
	config.SetAttributeValue("args", ctyval.Strings([]string{"queue", "controller"}))
	task.AppendNewline()
	componentEnv(task, q.Env, EnvQueueControllerSecrets, QueueControllerVariable, q.Secrets)
	taskResources(task, 200, 256)
	return f.Bytes(), nil
}
