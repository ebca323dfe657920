package render

import (
	"fmt"
	"path/filepath"

	"github.com/hashicorp/hcl/v2/hclwrite"
	"github.com/zclconf/go-cty/cty"

	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/ctyval"
)

// The gateway's job.
const (
	GatewayJob   = "gpujob-gateway"
	GatewayGroup = "gateway"
	// GatewayTask is short: its Task API socket,
	// <data_dir>/alloc/<alloc ID>/<task>/secrets/api.sock, must fit the
	// 107 bytes of a unix socket's path.
	GatewayTask = "gw"
	// GatewayService is the gateways' own Consul service.
	GatewayService = "gpujob-gateway"
	// DefaultGatewayPort is the static port every gateway listens on, so
	// that clients and load balancers have one address per node.
	DefaultGatewayPort = 8080
	// GatewayAdminPortLabel is the port of the gateways' admin listener
	// (/metrics, /-/stats), static too (by default the one after Port) and
	// bound to loopback: Nomad reserves it on the node, and only the node
	// reaches it.
	GatewayAdminPortLabel = "admin"
	// GatewayAdminService registers the admin listener in Consul, for a
	// Prometheus to find (the scrape needs the admin token beyond
	// loopback).
	GatewayAdminService = "gpujob-gateway-admin"
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
	// AdminPort is the admin listener's static port, on loopback; 0:
	// Port+1.
	AdminPort int
	// AdminPublic has the admin listener listen on the node's address
	// instead of loopback, for a Prometheus elsewhere: it needs Secrets,
	// whose variable's admin_token item guards it.
	AdminPublic bool
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
	adminPort := g.AdminPort
	if adminPort == 0 {
		adminPort = port + 1
	}
	if adminPort < 1 || adminPort > 65535 || adminPort == port {
		return nil, fmt.Errorf("render: gateway admin port %d is not a TCP port other than the gateway's %d (--admin-port)", adminPort, port)
	}
	if g.AdminPublic && !g.Secrets {
		return nil, fmt.Errorf("render: --admin-public needs --secrets: an admin listener beyond loopback needs the admin token " +
			"the gateways read from their variable (its admin_token item)")
	}
	adminListen := quoted(literal("127.0.0.1:"), interp("NOMAD_PORT_"+GatewayAdminPortLabel))
	if g.AdminPublic {
		adminListen = interpolation("NOMAD_ADDR_" + GatewayAdminPortLabel)
	}
	f, job := helperJob("# Rendered by `gpujob gateway render`: the gpujob gateways.\n",
		GatewayJob, "service", g.Datacenters, g.Namespace, g.NodePool)
	job.SetAttributeValue("meta", ctyval.StringMap(map[string]string{contract.MetaKind: contract.KindGateway}))
	job.AppendNewline()

	group := job.AppendNewBlock("group", []string{GatewayGroup}).Body()
	group.SetAttributeValue("count", cty.NumberIntVal(int64(count)))
	group.AppendNewline()
	network := group.AppendNewBlock("network", nil).Body()
	network.AppendNewBlock("port", []string{"http"}).Body().SetAttributeValue("static", cty.NumberIntVal(int64(port)))
	network.AppendNewBlock("port", []string{GatewayAdminPortLabel}).Body().SetAttributeValue("static", cty.NumberIntVal(int64(adminPort)))
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
		// The metrics and stats name every tenant's services: loopback,
		// unless a token guards them.
		hclwrite.TokensForValue(cty.StringVal("--admin-listen")),
		adminListen,
	}))
	task.AppendNewline()
	componentEnv(task, g.Env, EnvGatewaySecrets, GatewayVariable, g.Secrets)
	healthzService(task, GatewayService, "http", "2s", "1s")
	task.AppendNewline()
	// The admin listener, for a Prometheus to find: no check (Consul's
	// agent may not reach a loopback listener by the node's address).
	admin := task.AppendNewBlock("service", nil).Body()
	admin.SetAttributeValue("name", cty.StringVal(GatewayAdminService))
	admin.SetAttributeValue("port", cty.StringVal(GatewayAdminPortLabel))
	admin.SetAttributeValue("provider", cty.StringVal("consul"))
	admin.SetAttributeValue("tags", ctyval.Strings([]string{map[bool]string{true: "public", false: "loopback"}[g.AdminPublic]}))
	task.AppendNewline()
	taskResources(task, 500, 256)
	return f.Bytes(), nil
}

// componentEnv writes the environment and identity of one of gpujob's own
// raw_exec tasks (a gateway, an exporter). raw_exec hands a task the client
// agent's environment: every token variable is blanked, so that the
// component never acts with an agent's token and no process of its user
// finds one there; then env. With secrets, secretsEnv names the variable
// it reads its credentials from with its workload identity (package
// taskcreds), which it gets as a file, never in its environment.
func componentEnv(task *hclwrite.Body, env map[string]string, secretsEnv, variable string, secrets bool) {
	all := map[string]string{"NOMAD_TOKEN": "", "CONSUL_HTTP_TOKEN": "", "CONSUL_HTTP_TOKEN_FILE": "", "CONSUL_HTTP_AUTH": ""}
	for k, v := range env {
		all[k] = v
	}
	if secrets {
		all[secretsEnv] = variable
	}
	task.SetAttributeValue("env", ctyval.StringMap(all))
	task.AppendNewline()
	if secrets {
		id := task.AppendNewBlock("identity", nil).Body()
		id.SetAttributeValue("env", cty.False)
		id.SetAttributeValue("file", cty.True)
		task.AppendNewline()
	}
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
