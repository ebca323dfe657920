package render

import (
	"fmt"
	"path/filepath"

	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/hashicorp/hcl/v2/hclwrite"
	"github.com/zclconf/go-cty/cty"

	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/ctyval"
	"github.com/gpujob/gpujob/internal/safename"
)

// The sweep controller's job.
const (
	ControllerGroup = "controller"
	// ControllerTask is short: its Task API socket,
	// <data_dir>/alloc/<alloc ID>/<task>/secrets/api.sock, must fit the
	// 107 bytes of a unix socket's path, and Nomad skips it otherwise.
	ControllerTask = "ctl"
	// ControllerUser is the controller's default user: it needs no file
	// of the node, only the Nomad and Consul APIs.
	ControllerUser = "nobody"
)

// Controller describes a sweep's controller job.
type Controller struct {
	JobID     string
	Sweep     string
	Namespace string
	// Binary is the gpujob executable's absolute path on the clients.
	Binary string
	// User runs it (raw_exec's user); empty: ControllerUser.
	User string
	// Env is how it reaches Nomad and Consul: addresses (and TLS files
	// without ACLs), never a token: with ACLs it fetches its own (Identity).
	Env         map[string]string
	Datacenters []string
	NodePool    string
	// Identity hands the task its workload identity as a file
	// (secrets/nomad_token): on a cluster with ACLs it reads its own
	// credentials with it (cli/sweepcreds).
	Identity bool
}

// ControllerJobspec renders the job that runs a sweep's controller: one
// raw_exec task (the controller is a Go binary talking to two HTTP APIs;
// it needs no GPU, no file of the node and no isolation beyond an
// unprivileged user), restarted at once if it dies (a new controller
// resumes from the state in Consul) and rescheduled without limit if its
// node goes. It exits 0 once the sweep has ended.
func ControllerJobspec(c Controller) ([]byte, error) {
	if c.Sweep == "" || c.JobID == "" {
		return nil, fmt.Errorf("render: a controller needs its sweep and job ID")
	}
	if err := safename.Validate(c.JobID); err != nil {
		return nil, fmt.Errorf("render: job name %q %v: it must be %s", c.JobID, err, safename.Allowed)
	}
	if !filepath.IsAbs(c.Binary) {
		return nil, fmt.Errorf("render: the controller's gpujob binary %q is not an absolute path", c.Binary)
	}
	user := c.User
	if user == "" {
		user = ControllerUser
	}
	f, job := helperJob("# Rendered by `gpujob sweep submit`: the controller of sweep "+c.Sweep+".\n",
		c.JobID, "batch", c.Datacenters, c.Namespace, c.NodePool)
	job.SetAttributeValue("meta", ctyval.StringMap(map[string]string{contract.MetaKind: contract.KindSweepController, contract.MetaSweep: c.Sweep}))
	job.AppendNewline()

	group := job.AppendNewBlock("group", []string{ControllerGroup}).Body()
	controllerRestarts(group)

	task := group.AppendNewBlock("task", []string{ControllerTask}).Body()
	task.SetAttributeValue("driver", cty.StringVal("raw_exec"))
	task.SetAttributeValue("user", cty.StringVal(user))
	task.SetAttributeValue("kill_timeout", cty.StringVal("10s"))
	task.AppendNewline()
	config := task.AppendNewBlock("config", nil).Body()
	config.SetAttributeValue("command", cty.StringVal(c.Binary))
	args := []string{"sweep", "controller"}
	if c.Namespace != "" {
		args = append(args, "--namespace", c.Namespace)
	}
	config.SetAttributeValue("args", ctyval.Strings(append(args, c.Sweep)))
	task.AppendNewline()
	if len(c.Env) > 0 {
		task.SetAttributeValue("env", ctyval.StringMap(c.Env))
		task.AppendNewline()
	}
	if c.Identity {
		id := task.AppendNewBlock("identity", nil).Body()
		id.SetAttributeValue("env", cty.False)
		id.SetAttributeValue("file", cty.True)
		task.AppendNewline()
	}
	res := task.AppendNewBlock("resources", nil).Body()
	res.SetAttributeValue("cpu", cty.NumberIntVal(100))
	res.SetAttributeValue("memory", cty.NumberIntVal(128))
	return f.Bytes(), nil
}

// helperJob starts the file of one of gpujob's own jobs (the sweep
// controller, the gateways): a comment, then the job block with its type,
// its datacenters (all by default), and a namespace and node pool when set.
func helperJob(comment, id, typ string, dcs []string, namespace, nodePool string) (*hclwrite.File, *hclwrite.Body) {
	f := hclwrite.NewEmptyFile()
	body := f.Body()
	body.AppendUnstructuredTokens(hclwrite.Tokens{{Type: hclsyntax.TokenComment, Bytes: []byte(comment)}})
	body.AppendNewline()
	job := body.AppendNewBlock("job", []string{id}).Body()
	job.SetAttributeValue("type", cty.StringVal(typ))
	if len(dcs) == 0 {
		dcs = []string{"*"}
	}
	job.SetAttributeValue("datacenters", ctyval.Strings(dcs))
	if namespace != "" {
		job.SetAttributeValue("namespace", cty.StringVal(namespace))
	}
	if nodePool != "" {
		job.SetAttributeValue("node_pool", cty.StringVal(nodePool))
	}
	return f, job
}

// controllerRestarts gives a controller's group (a sweep's, the queue's)
// its restart and reschedule policy: restarted at once when it dies, and
// rescheduled without limit when its node goes, since its state is in
// Consul. A controller that cannot start at all (a wrong binary) is tried
// again less and less often.
func controllerRestarts(group *hclwrite.Body) {
	restart := group.AppendNewBlock("restart", nil).Body()
	restart.SetAttributeValue("attempts", cty.NumberIntVal(10))
	restart.SetAttributeValue("interval", cty.StringVal("10m"))
	restart.SetAttributeValue("delay", cty.StringVal("1s"))
	restart.SetAttributeValue("mode", cty.StringVal("fail"))
	group.AppendNewline()
	reschedule := group.AppendNewBlock("reschedule", nil).Body()
	reschedule.SetAttributeValue("attempts", cty.Zero)
	reschedule.SetAttributeValue("unlimited", cty.True)
	reschedule.SetAttributeValue("delay", cty.StringVal("5s"))
	reschedule.SetAttributeValue("delay_function", cty.StringVal("exponential"))
	reschedule.SetAttributeValue("max_delay", cty.StringVal("5m"))
	group.AppendNewline()
}
