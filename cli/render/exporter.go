package render

import (
	"fmt"
	"path/filepath"

	"github.com/hashicorp/hcl/v2/hclwrite"
	"github.com/zclconf/go-cty/cty"

	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/ctyval"
)

// The exporter's job.
const (
	ExporterJob   = "gpujob-exporter"
	ExporterGroup = "exporter"
	// ExporterTask is short: its Task API socket,
	// <data_dir>/alloc/<alloc ID>/<task>/secrets/api.sock, must fit the
	// 107 bytes of a unix socket's path, and Nomad skips it otherwise.
	ExporterTask = "exp"
	// ExporterService is the exporters' Consul service: what Prometheus
	// discovers them by.
	ExporterService = "gpujob-exporter"
	// DefaultExporterPort is the DCGM exporter's port, so scrape configs
	// written for it find gpujob's.
	DefaultExporterPort = 9400
)

// ExporterVariable is the Nomad variable an exporter job with Secrets
// reads: its own job's path, which its tasks may read without any policy.
const ExporterVariable = "nomad/jobs/" + ExporterJob

// EnvExporterSecrets names the variable an exporter reads its credentials
// from (gpujob exporter run).
const EnvExporterSecrets = "GPUJOB_EXPORTER_SECRETS"

// DefaultExporterUser is who the exporters run as: nobody, or, holding
// tokens, a user of their own: the gpujob driver's ranks run as nobody,
// and a process of the same user could read the exporter's identity file,
// reach its Task API socket or trace it.
func DefaultExporterUser(secrets bool) string {
	if secrets {
		return "gpujob-exporter"
	}
	return "nobody"
}

// Exporter describes the exporter's job.
type Exporter struct {
	// Binary is the gpujob executable's absolute path on the clients.
	Binary string
	// Port is the static port every exporter listens on (DCGM's 9400 by
	// default in the CLI); 0 lets Nomad pick one per node, for clusters
	// of several clients on one machine (Prometheus finds them in Consul).
	Port int
	User string // raw_exec's user; empty: nobody
	// Env is how it reaches Nomad and Consul: addresses and TLS files.
	Env         map[string]string
	Datacenters []string
	NodePool    string
	Namespace   string
	// Secrets has the exporters read their tokens and Consul TLS material
	// from the Nomad variable ExporterVariable with their workload
	// identity, through their Task API socket (a cluster with ACLs or
	// TLS): EnvExporterSecrets names it.
	Secrets bool
}

// ExporterJobspec renders the system job that runs one exporter per node
// (raw_exec: a Go binary reading Nomad's and Consul's APIs; it needs no
// GPU and no file of the node). Each reports its own node's GPUs; the one
// on the lowest node ID among the running exporters also reports the
// cluster-wide series (gpujob exporter run --cluster auto).
func ExporterJobspec(e Exporter) ([]byte, error) {
	if !filepath.IsAbs(e.Binary) {
		return nil, fmt.Errorf("render: the exporter's gpujob binary %q is not an absolute path", e.Binary)
	}
	port := e.Port
	if port < 0 || port > 65535 {
		return nil, fmt.Errorf("render: exporter port %d is not a TCP port", port)
	}
	f, job := helperJob("# Rendered by `gpujob exporter render`: the gpujob Prometheus exporters, one per node.\n",
		ExporterJob, "system", e.Datacenters, e.Namespace, e.NodePool)
	job.SetAttributeValue("meta", ctyval.StringMap(map[string]string{contract.MetaKind: contract.KindExporter}))
	job.AppendNewline()

	group := job.AppendNewBlock("group", []string{ExporterGroup}).Body()
	port0 := group.AppendNewBlock("network", nil).Body().AppendNewBlock("port", []string{"metrics"}).Body()
	if port > 0 {
		port0.SetAttributeValue("static", cty.NumberIntVal(int64(port)))
	}
	group.AppendNewline()

	task := group.AppendNewBlock("task", []string{ExporterTask}).Body()
	task.SetAttributeValue("driver", cty.StringVal("raw_exec"))
	task.SetAttributeValue("user", cty.StringVal(firstNonEmpty(e.User, DefaultExporterUser(e.Secrets))))
	task.AppendNewline()
	config := task.AppendNewBlock("config", nil).Body()
	config.SetAttributeValue("command", cty.StringVal(e.Binary))
	config.SetAttributeRaw("args", hclwrite.TokensForTuple([]hclwrite.Tokens{
		hclwrite.TokensForValue(cty.StringVal("exporter")),
		hclwrite.TokensForValue(cty.StringVal("run")),
		hclwrite.TokensForValue(cty.StringVal("--listen")),
		interpolation("NOMAD_ADDR_metrics"),
		hclwrite.TokensForValue(cty.StringVal("--node")),
		interpolation("node", "unique", "id"),
	}))
	task.AppendNewline()
	componentEnv(task, e.Env, EnvExporterSecrets, ExporterVariable, e.Secrets)
	healthzService(task, ExporterService, "metrics", "5s", "2s")
	task.AppendNewline()
	taskResources(task, 200, 128)
	return f.Bytes(), nil
}
