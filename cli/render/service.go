package render

import (
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/hashicorp/hcl/v2/hclwrite"
	"github.com/zclconf/go-cty/cty"

	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/ctyval"
	"github.com/gpujob/gpujob/internal/queue/queuefile"
)

// A service's job.
const (
	// ServiceGroup and ServiceTask name the replicas' group and task;
	// ServicePort labels the port each replica's server listens on
	// ($PORT).
	ServiceGroup = "serve"
	ServiceTask  = "serve"
	ServicePort  = "http"
	// EnvVersion carries the version to the server, which answers with it.
	EnvVersion = contract.EnvServiceVersion
	// Consul tags: every replica's, the namespace's (the gateway's health
	// query filters on it; Consul OSS has no namespaces of its own), the
	// version's, and the one a canary of an unpromoted deployment adds.
	TagService    = "gpujob"
	TagNSPrefix   = "gpujob-ns="
	TagVerPrefix  = "gpujob-version="
	TagCanary     = "gpujob-canary"
	ServiceKillTO = 15 * time.Second
)

const serviceHeader = "# Rendered by `gpujob service render` from a service spec: edit the spec, not this file.\n"

// ServiceOptions are the settings of a service render that do not come
// from the spec.
type ServiceOptions struct {
	// Namespace is the one the job runs in when the spec names none
	// (the CLI's --namespace); "" is "default".
	Namespace string
}

// ServiceNamespace is the namespace s runs in under o.
func (o ServiceOptions) ServiceNamespace(s *spec.Service) string {
	return firstNonEmpty(s.Namespace, o.Namespace, "default")
}

// ServiceTag is the Consul tag of the replicas of a service in namespace ns.
func ServiceTag(ns string) string { return TagNSPrefix + ns }

// ServiceJobspec renders the Nomad service job for s: one group of replicas
// on the gpujob driver (a process each, no rendezvous), a port the server
// reads from $PORT, registered in Consul with an HTTP check the gateway
// routes by, a rolling update with canaries, a scaling policy within the
// replica bounds, and Traefik Consul Catalog tags.
func (o ServiceOptions) ServiceJobspec(s *spec.Service) ([]byte, error) {
	if s == nil || s.Name == "" || s.Command == "" || s.Version == "" {
		return nil, fmt.Errorf("render: service spec is incomplete (name, command and version are required)")
	}
	r := s.Replicas
	if r.Min < 0 || r.Max < 1 || r.Min > r.Max || r.Initial < r.Min || r.Initial > r.Max {
		return nil, fmt.Errorf("render: service %q: replicas %d..%d (initial %d) are not a valid range", s.Name, r.Min, r.Max, r.Initial)
	}
	ns := o.ServiceNamespace(s)
	f := hclwrite.NewEmptyFile()
	body := f.Body()
	body.AppendUnstructuredTokens(hclwrite.Tokens{{Type: hclsyntax.TokenComment, Bytes: []byte(serviceHeader)}})
	body.AppendNewline()

	job := body.AppendNewBlock("job", []string{s.Name}).Body()
	job.SetAttributeValue("type", cty.StringVal("service"))
	job.SetAttributeValue("datacenters", ctyval.Strings(s.Datacenters))
	if s.Namespace != "" || o.Namespace != "" {
		job.SetAttributeValue("namespace", cty.StringVal(ns))
	}
	if s.NodePool != "" {
		job.SetAttributeValue("node_pool", cty.StringVal(s.NodePool))
	}
	if s.Priority != 0 && s.Priority != spec.DefaultPriority {
		job.SetAttributeValue("priority", cty.NumberIntVal(int64(s.Priority)))
	}
	meta := map[string]string{}
	for k, v := range s.Meta {
		meta[k] = v
	}
	meta[contract.MetaKind] = contract.KindService
	meta[contract.MetaVersion] = s.Version
	meta[contract.MetaTask] = ServiceTask
	if s.Queue != "" {
		if err := queuefile.CheckName(s.Queue); err != nil {
			return nil, fmt.Errorf("render: %w", err)
		}
		meta[contract.MetaQueue] = s.Queue
	}
	job.SetAttributeValue("meta", ctyval.StringMap(meta))
	job.AppendNewline()

	group := job.AppendNewBlock("group", []string{ServiceGroup}).Body()
	group.SetAttributeValue("count", cty.NumberIntVal(int64(r.Initial)))
	group.AppendNewline()
	group.AppendNewBlock("network", nil).Body().AppendNewBlock("port", []string{ServicePort})
	group.AppendNewline()
	// The count moves within the replica bounds: by the gateway's
	// autoscaler, by `gpujob service scale`, by anyone's `nomad job scale`.
	scaling := group.AppendNewBlock("scaling", nil).Body()
	scaling.SetAttributeValue("enabled", cty.True)
	scaling.SetAttributeValue("min", cty.NumberIntVal(int64(r.Min)))
	scaling.SetAttributeValue("max", cty.NumberIntVal(int64(r.Max)))
	group.AppendNewline()
	update(group, s)
	group.AppendNewline()
	// A replica that exits is restarted in place, with a delay; one that
	// keeps failing its check after the initial delay is restarted by
	// check_restart through this same policy.
	restart := group.AppendNewBlock("restart", nil).Body()
	restart.SetAttributeValue("attempts", cty.NumberIntVal(3))
	restart.SetAttributeValue("interval", cty.StringVal("5m"))
	restart.SetAttributeValue("delay", cty.StringVal("5s"))
	restart.SetAttributeValue("mode", cty.StringVal("delay"))
	group.AppendNewline()

	task := group.AppendNewBlock("task", []string{ServiceTask}).Body()
	task.SetAttributeValue("driver", cty.StringVal(Driver))
	// Stopping: Nomad deregisters the replica from Consul, waits
	// shutdown_delay (the gateway drops it from its pool well within it,
	// so no new request comes), then SIGTERM; the server finishes what it
	// serves within kill_timeout.
	task.SetAttributeValue("shutdown_delay", cty.StringVal(Duration(spec.DefaultShutdownDelay)))
	task.SetAttributeValue("kill_timeout", cty.StringVal(Duration(ServiceKillTO)))
	task.AppendNewline()
	config := task.AppendNewBlock("config", nil).Body()
	config.SetAttributeValue("command", cty.StringVal(s.Command))
	if len(s.Args) > 0 {
		config.SetAttributeValue("args", ctyval.Strings(s.Args))
	}
	if s.Workdir != "" {
		config.SetAttributeValue("workdir", cty.StringVal(s.Workdir))
	}
	config.SetAttributeValue("service", cty.True)
	env := map[string]string{EnvVersion: s.Version}
	for k, v := range s.Env {
		env[k] = v
	}
	config.SetAttributeValue("env", ctyval.StringMap(env))
	task.AppendNewline()
	// PORT in the task's environment, which Nomad interpolates.
	task.AppendNewBlock("env", nil).Body().SetAttributeRaw("PORT", interpolation("NOMAD_PORT_"+ServicePort))
	task.AppendNewline()
	service(task, s, ns)
	resources(task, s.Resources.CPU, s.Resources.MemoryMiB, s.GPUsPerReplica, s.GPU)
	return f.Bytes(), nil
}

// update writes the rolling update: canaries, auto promote and revert, and
// deadlines that leave a replica its initial delay to load its model.
func update(group *hclwrite.Body, s *spec.Service) {
	u := s.Update
	up := group.AppendNewBlock("update", nil).Body()
	up.SetAttributeValue("max_parallel", cty.NumberIntVal(int64(u.MaxParallel)))
	if u.Canary > 0 {
		up.SetAttributeValue("canary", cty.NumberIntVal(int64(u.Canary)))
		up.SetAttributeValue("auto_promote", cty.BoolVal(u.AutoPromote))
	}
	up.SetAttributeValue("auto_revert", cty.BoolVal(u.AutoRevert))
	up.SetAttributeValue("health_check", cty.StringVal("checks"))
	healthy, progress := Deadlines(s)
	up.SetAttributeValue("min_healthy_time", cty.StringVal(Duration(u.MinHealthyTime)))
	up.SetAttributeValue("healthy_deadline", cty.StringVal(Duration(healthy)))
	up.SetAttributeValue("progress_deadline", cty.StringVal(Duration(progress)))
}

// Deadlines are the update's healthy and progress deadlines: a replica has
// its initial delay plus the time for its check to pass a few times and
// stay healthy; the deployment fails (and auto_revert reverts it) when no
// replica turned healthy in half as long again, Nomad's progress deadline
// being later than the healthy one by rule.
func Deadlines(s *spec.Service) (healthy, progress time.Duration) {
	healthy = s.Health.InitialDelay + s.Update.MinHealthyTime + max(10*time.Second, 10*s.Health.Interval)
	return healthy, (healthy + max(10*time.Second, healthy/2)).Round(time.Second)
}

// service writes the replica's Consul registration and its HTTP check.
func service(task *hclwrite.Body, s *spec.Service, ns string) {
	svc := task.AppendNewBlock("service", nil).Body()
	svc.SetAttributeValue("name", cty.StringVal(s.Name))
	svc.SetAttributeValue("port", cty.StringVal(ServicePort))
	svc.SetAttributeValue("provider", cty.StringVal("consul"))
	tags := []string{TagService, ServiceTag(ns), TagVerPrefix + s.Version}
	if s.Route.Traefik {
		tags = append(tags, TraefikTags(s, ns)...)
	}
	svc.SetAttributeValue("tags", ctyval.Strings(tags))
	// Nomad puts canary_tags instead of tags on a canary of an unpromoted
	// deployment.
	svc.SetAttributeValue("canary_tags", ctyval.Strings(append(append([]string(nil), tags...), TagCanary)))
	svc.AppendNewline()
	// Nomad reads a service's meta as a block only.
	meta := svc.AppendNewBlock("meta", nil).Body()
	meta.SetAttributeValue(contract.MetaNamespace, cty.StringVal(ns))
	meta.SetAttributeValue(contract.MetaVersion, cty.StringVal(s.Version))
	svc.AppendNewline()
	h := s.Health
	check := svc.AppendNewBlock("check", nil).Body()
	check.SetAttributeValue("name", cty.StringVal("ready"))
	check.SetAttributeValue("type", cty.StringVal("http"))
	check.SetAttributeValue("path", cty.StringVal(h.Path))
	check.SetAttributeValue("interval", cty.StringVal(Duration(h.Interval)))
	check.SetAttributeValue("timeout", cty.StringVal(Duration(h.Timeout)))
	check.AppendNewline()
	// Never restarted while it may still be loading its model; after
	// that, three failed checks in a row restart it.
	cr := check.AppendNewBlock("check_restart", nil).Body()
	cr.SetAttributeValue("limit", cty.NumberIntVal(3))
	cr.SetAttributeValue("grace", cty.StringVal(Duration(max(h.InitialDelay, time.Second))))
}

// TraefikTags route Traefik's Consul Catalog provider to the replicas the
// way the gateway routes (prefix, host, the prefix stripped), for
// operators who run Traefik; they bypass the gateway's tokens and limits,
// so a spec asks for them (route { traefik = true }, without auth).
func TraefikTags(s *spec.Service, ns string) []string {
	name := ns + "-" + s.Name
	rule := fmt.Sprintf("PathPrefix(`%s`)", s.Route.Path)
	if s.Route.Host != "" {
		rule = fmt.Sprintf("Host(`%s`) && %s", s.Route.Host, rule)
	}
	return []string{
		"traefik.enable=true",
		fmt.Sprintf("traefik.http.routers.%s.rule=%s", name, rule),
		fmt.Sprintf("traefik.http.routers.%s.middlewares=%s-strip", name, name),
		fmt.Sprintf("traefik.http.middlewares.%s-strip.stripprefix.prefixes=%s", name, s.Route.Path),
	}
}

func firstNonEmpty(vals ...string) string {
	for _, v := range vals {
		if strings.TrimSpace(v) != "" {
			return v
		}
	}
	return ""
}
