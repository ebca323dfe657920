package render

import (
	"fmt"
	"path/filepath"

	"github.com/hashicorp/hcl/v2/hclwrite"
	"github.com/zclconf/go-cty/cty"

	"github.com/gpujob/gpujob/internal/ctyval"
)

// The gateway's job.
const (
	MetaKindGateway = "gateway"
	GatewayJob      = "gpujob-gateway"
	GatewayGroup    = "gateway"
	// GatewayTask is short: its Task API socket,
	// <data_dir>/alloc/<alloc ID>/<task>/secrets/api.sock, must fit the
	// 107 bytes of a unix socket's path.
	GatewayTask = "gw"
	// GatewayService is the gateways' own Consul service.
	GatewayService = "gpujob-gateway"
	// DefaultGatewayPort is the static port every gateway listens on, so
	// that clients and load balancers have one address per node.
	DefaultGatewayPort = 8080
)

// DefaultGatewayUser is who the gateways run as: nobody, or, holding
// tokens, a user of their own, since the replicas run as nobody and a
// process of the same user could read the gateway's environment.
func DefaultGatewayUser(secrets bool) string {
	if secrets {
		return "gpujob-gateway"
	}
	return "nobody"
}

// Gateway describes the gateway's job.
type Gateway struct {
	// Binary is the gpujob executable's absolute path on the clients.
	Binary string
	// Count gateways, each on its own node (the static port); 0 is 1.
	Count int
	Port  int // 0: DefaultGatewayPort
	// User runs it (raw_exec's user); empty: "nobody".
	User string
	// Env is how it reaches Consul and Nomad: addresses and TLS files.
	Env         map[string]string
	Datacenters []string
	NodePool    string
	Namespace   string
	// Secrets has the gateways read their tokens and Consul TLS material
	// from the Nomad variable GatewayVariable with their workload identity,
	// through their Task API socket, instead of the environment (a cluster
	// with ACLs or TLS): EnvGatewaySecrets names it.
	Secrets bool
}

// GatewayVariable is the Nomad variable a gateway job with Secrets reads:
// its own job's path, which its tasks may read without any policy.
const GatewayVariable = "nomad/jobs/" + GatewayJob

// EnvGatewaySecrets names the variable a gateway reads its credentials
// from (gpujob gateway run).
const EnvGatewaySecrets = "GPUJOB_GATEWAY_SECRETS"

// GatewayJobspec renders the job that runs the gateways: raw_exec (the
// gateway is a Go binary talking HTTP; it needs no GPU and no file of the
// node) on a static port, registered in Consul with a check on its own
// health, deregistered two seconds before it is stopped so that a load
// balancer in front stops sending to it first.
func GatewayJobspec(g Gateway) ([]byte, error) {
	if !filepath.IsAbs(g.Binary) {
		return nil, fmt.Errorf("render: the gateway's gpujob binary %q is not an absolute path", g.Binary)
	}
	count, port, user := max(g.Count, 1), g.Port, firstNonEmpty(g.User, DefaultGatewayUser(g.Secrets))
	if port == 0 {
		port = DefaultGatewayPort
	}
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("render: gateway port %d is not a TCP port", port)
	}
	f, job := helperJob("# Rendered by `gpujob gateway render`: the gpujob gateways.\n",
		GatewayJob, "service", g.Datacenters, g.Namespace, g.NodePool)
	job.SetAttributeValue("meta", ctyval.StringMap(map[string]string{MetaKind: MetaKindGateway}))
	job.AppendNewline()

	group := job.AppendNewBlock("group", []string{GatewayGroup}).Body()
	group.SetAttributeValue("count", cty.NumberIntVal(int64(count)))
	group.AppendNewline()
	port0 := group.AppendNewBlock("network", nil).Body().AppendNewBlock("port", []string{"http"}).Body()
	port0.SetAttributeValue("static", cty.NumberIntVal(int64(port)))
	group.AppendNewline()
	// One gateway per node: the port is static.
	c := group.AppendNewBlock("constraint", nil).Body()
	c.SetAttributeValue("operator", cty.StringVal("distinct_hosts"))
	c.SetAttributeValue("value", cty.StringVal("true"))
	group.AppendNewline()

	task := group.AppendNewBlock("task", []string{GatewayTask}).Body()
	task.SetAttributeValue("driver", cty.StringVal("raw_exec"))
	task.SetAttributeValue("user", cty.StringVal(user))
	task.SetAttributeValue("shutdown_delay", cty.StringVal("2s"))
	task.SetAttributeValue("kill_timeout", cty.StringVal("25s"))
	task.AppendNewline()
	config := task.AppendNewBlock("config", nil).Body()
	config.SetAttributeValue("command", cty.StringVal(g.Binary))
	config.SetAttributeRaw("args", hclwrite.TokensForTuple([]hclwrite.Tokens{
		hclwrite.TokensForValue(cty.StringVal("gateway")),
		hclwrite.TokensForValue(cty.StringVal("run")),
		hclwrite.TokensForValue(cty.StringVal("--listen")),
		interpolation("NOMAD_ADDR_http"),
	}))
	task.AppendNewline()
	env := map[string]string{}
	for k, v := range g.Env {
		env[k] = v
	}
	if g.Secrets {
		env[EnvGatewaySecrets] = GatewayVariable
	}
	if len(env) > 0 {
		task.SetAttributeValue("env", ctyval.StringMap(env))
		task.AppendNewline()
	}
	if g.Secrets {
		id := task.AppendNewBlock("identity", nil).Body()
		id.SetAttributeValue("env", cty.False)
		id.SetAttributeValue("file", cty.True)
		task.AppendNewline()
	}
	healthzService(task, GatewayService, "http", "2s", "1s")
	task.AppendNewline()
	taskResources(task, 500, 256)
	return f.Bytes(), nil
}

// healthzService registers the task in Consul as name on its port, with
// an HTTP check of /-/healthz: what gpujob's helper daemons serve.
func healthzService(task *hclwrite.Body, name, port, interval, timeout string) {
	svc := task.AppendNewBlock("service", nil).Body()
	svc.SetAttributeValue("name", cty.StringVal(name))
	svc.SetAttributeValue("port", cty.StringVal(port))
	svc.SetAttributeValue("provider", cty.StringVal("consul"))
	svc.AppendNewline()
	check := svc.AppendNewBlock("check", nil).Body()
	check.SetAttributeValue("type", cty.StringVal("http"))
	check.SetAttributeValue("path", cty.StringVal("/-/healthz"))
	check.SetAttributeValue("interval", cty.StringVal(interval))
	check.SetAttributeValue("timeout", cty.StringVal(timeout))
}

// taskResources sets a task's CPU (MHz) and memory (MiB).
func taskResources(task *hclwrite.Body, cpu, memoryMiB int64) {
	res := task.AppendNewBlock("resources", nil).Body()
	res.SetAttributeValue("cpu", cty.NumberIntVal(cpu))
	res.SetAttributeValue("memory", cty.NumberIntVal(memoryMiB))
}
