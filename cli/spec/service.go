package spec

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"path"
	"regexp"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/zclconf/go-cty/cty"

	"github.com/gpujob/gpujob/internal/servekv"
)

// Defaults of the optional service fields.
const (
	DefaultGPUsPerReplica    = 1
	DefaultHealthPath        = "/healthz"
	DefaultHealthInterval    = 2 * time.Second
	DefaultHealthTimeout     = 1 * time.Second
	DefaultInitialDelay      = 1 * time.Minute
	DefaultMinHealthyTime    = 5 * time.Second
	DefaultRouteTimeout      = 60 * time.Second
	DefaultQueueLimit        = 100
	DefaultQueueTimeout      = 60 * time.Second
	DefaultScaleDownDelay    = 5 * time.Minute
	DefaultShutdownDelay     = 3 * time.Second
	MaxReplicas              = 1000
	MaxServiceNameLen        = 63 // a Consul service name is a DNS label
	DefaultServiceKillTimout = 10 * time.Second
)

// MaxRouteBody is the largest route.max_body: the gateway buffers a body
// whole, and its own --max-buffered bounds it further.
const MaxRouteBody = 1 << 30

// Service is a decoded `service` block: a model server with its replicas,
// health check, rolling update, autoscaling and gateway route.
type Service struct {
	Name           string
	GPUsPerReplica int // nvidia/gpu devices per replica, >= 0
	Command        string
	Args           []string
	Env            map[string]string
	Workdir        string
	// Version labels what the replicas serve (the gateway's metrics, the
	// X-Model-Version the workload answers with); default: a digest of
	// what the replicas run, so any change of it is a new version.
	Version   string
	Replicas  Replicas
	Health    Health
	Update    Update
	Autoscale *Autoscale // nil: a fixed count (Replicas.Initial)
	Route     Route
	Resources Resources
	GPU       *GPU

	Datacenters []string
	NodePool    string
	Namespace   string
	Priority    int
	// Queue is the queue the service is deployed into; "" is the default
	// queue. service deploy --queue overrides it.
	Queue  string
	Meta   map[string]string
	Ranges Ranges
}

// Replicas bounds the group's count.
type Replicas struct {
	Min, Max, Initial int
}

// Health is the replicas' HTTP readiness check, which Consul runs and the
// gateway routes by.
type Health struct {
	Path     string
	Interval time.Duration
	Timeout  time.Duration
	// InitialDelay is how long a replica may take to load its model: its
	// failing check neither restarts it nor fails a deployment before then.
	InitialDelay time.Duration
}

// Update is the rolling update (Nomad's update block).
type Update struct {
	Canary         int
	MaxParallel    int
	AutoPromote    bool
	AutoRevert     bool
	MinHealthyTime time.Duration
}

// Autoscale sets the count from the requests in flight at the gateways.
type Autoscale struct {
	TargetInflight float64 // per replica
	ScaleUpDelay   time.Duration
	ScaleDownDelay time.Duration
}

// Route is the gateway's route to the service.
type Route struct {
	Path string // path prefix; default "/<name>"
	Host string // also match this Host when set
	Auth bool   // bearer tokens required (default true)
	// Traefik adds Traefik Consul Catalog tags to the replicas, so a
	// Traefik routes to them too: without the gateway's tokens and limits.
	Traefik      bool
	RateLimit    *RateLimit
	Timeout      time.Duration
	QueueLimit   int
	QueueTimeout time.Duration
	// MaxBodyBytes bounds a request's body at the gateway (which buffers
	// it); 0 = the gateway's --max-body.
	MaxBodyBytes int64
}

// RateLimit is a token bucket per bearer token.
type RateLimit struct {
	RPS   float64
	Burst int
}

var serviceSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "gpus_per_replica"},
		{Name: "command"},
		{Name: "args"},
		{Name: "env"},
		{Name: "workdir"},
		{Name: "version"},
		{Name: "datacenters"},
		{Name: "node_pool"},
		{Name: "namespace"},
		{Name: "priority"},
		{Name: "queue"},
		{Name: "meta"},
	},
	Blocks: []hcl.BlockHeaderSchema{
		{Type: "replicas"}, {Type: "health"}, {Type: "update"}, {Type: "autoscale"},
		{Type: "route"}, {Type: "resources"}, {Type: "gpu"},
	},
}

var replicasSchema = &hcl.BodySchema{Attributes: []hcl.AttributeSchema{{Name: "min"}, {Name: "max"}, {Name: "initial"}}}
var healthSchema = &hcl.BodySchema{Attributes: []hcl.AttributeSchema{{Name: "path"}, {Name: "interval"}, {Name: "timeout"}, {Name: "initial_delay"}}}
var updateSchema = &hcl.BodySchema{Attributes: []hcl.AttributeSchema{
	{Name: "canary"}, {Name: "max_parallel"}, {Name: "auto_promote"}, {Name: "auto_revert"}, {Name: "min_healthy_time"}}}
var autoscaleSchema = &hcl.BodySchema{Attributes: []hcl.AttributeSchema{
	{Name: "target_inflight", Required: true}, {Name: "scale_up_delay"}, {Name: "scale_down_delay"}}}
var routeSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{{Name: "path"}, {Name: "host"}, {Name: "auth"}, {Name: "timeout"}, {Name: "queue_limit"}, {Name: "queue_timeout"}, {Name: "traefik"}, {Name: "max_body"}},
	Blocks:     []hcl.BlockHeaderSchema{{Type: "rate_limit"}},
}
var rateLimitSchema = &hcl.BodySchema{Attributes: []hcl.AttributeSchema{{Name: "rps", Required: true}, {Name: "burst"}}}

var (
	validRoutePath = regexp.MustCompile(`^(/[A-Za-z0-9._~-]+)+$`)
	validHost      = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*$`)
	validVersion   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)
	validSvcName   = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)
)

// reservedRoutes are the gateway's own paths.
var reservedRoutes = []string{"/metrics", "/-"}

// ParseServiceFile reads the service spec at path.
func ParseServiceFile(path string, o Options) (*Service, hcl.Diagnostics) {
	s, _, diags := LoadService(path, o)
	return s, diags
}

// ParseService reads a service spec from src; filename names it in
// diagnostics.
func ParseService(src []byte, filename string, o Options) (*Service, hcl.Diagnostics) {
	s, _, diags := LoadServiceSource(src, filename, o)
	return s, diags
}

// LoadService is ParseServiceFile that also returns the sources it read.
func LoadService(path string, o Options) (*Service, map[string]*hcl.File, hcl.Diagnostics) {
	p, f, diags := parseSpecFile(path)
	return decodeServiceFile(p, f, diags, o)
}

// LoadServiceSource is ParseService that also returns the sources it read.
func LoadServiceSource(src []byte, filename string, o Options) (*Service, map[string]*hcl.File, hcl.Diagnostics) {
	p, f, diags := parseSpecSource(src, filename)
	return decodeServiceFile(p, f, diags, o)
}

func decodeServiceFile(p *hclparse.Parser, f *hcl.File, diags hcl.Diagnostics, o Options) (*Service, map[string]*hcl.File, hcl.Diagnostics) {
	sf, diags := readFile(p, f, diags, o, "service")
	if sf == nil {
		return nil, p.Files(), diags
	}
	ctx := &hcl.EvalContext{Variables: map[string]cty.Value{"var": sf.varObj}, Functions: functions}
	s, d := decodeService(sf.block, ctx)
	diags = append(diags, d...)
	if diags.HasErrors() {
		return nil, p.Files(), diags
	}
	return s, p.Files(), diags
}

func decodeService(b *hcl.Block, ctx *hcl.EvalContext) (*Service, hcl.Diagnostics) {
	d := &decoder{ctx: ctx, attrs: map[string]hcl.Range{}}
	s := &Service{
		Name:           b.Labels[0],
		GPUsPerReplica: DefaultGPUsPerReplica,
		Replicas:       Replicas{Min: 1, Max: 1, Initial: 1},
		Health: Health{Path: DefaultHealthPath, Interval: DefaultHealthInterval, Timeout: DefaultHealthTimeout,
			InitialDelay: DefaultInitialDelay},
		Update:      Update{MaxParallel: 1, AutoRevert: true, MinHealthyTime: DefaultMinHealthyTime},
		Route:       Route{Auth: true, Timeout: DefaultRouteTimeout, QueueLimit: DefaultQueueLimit, QueueTimeout: DefaultQueueTimeout},
		Resources:   Resources{CPU: DefaultCPU, MemoryMiB: DefaultMemoryMiB},
		Datacenters: []string{"*"},
		Priority:    DefaultPriority,
	}
	s.Ranges = Ranges{Block: b.DefRange, Name: b.LabelRanges[0], Attrs: d.attrs}
	// The name is the Nomad job ID, the Consul service name (a DNS label)
	// and the default route: lower-case letters, digits and dashes.
	if !validSvcName.MatchString(s.Name) || len(s.Name) > MaxServiceNameLen {
		d.errorf(b.LabelRanges[0], "Invalid service name",
			"The service's name %q becomes the Nomad job ID, the Consul service name and the route /%s: it must be 1 to %d lower-case letters, digits and dashes, starting and ending with a letter or digit.",
			s.Name, s.Name, MaxServiceNameLen)
	}
	c := d.content(b, serviceSchema)
	at := c.Attributes

	if d.int("gpus_per_replica", at["gpus_per_replica"], &s.GPUsPerReplica) && s.GPUsPerReplica < 0 {
		d.errorf(at["gpus_per_replica"].Expr.Range(), "Invalid gpus_per_replica", "gpus_per_replica must be 0 (a CPU service) or more, got %d.", s.GPUsPerReplica)
	}
	if a := at["command"]; a == nil {
		d.errorf(b.DefRange, "Missing required argument", `The service block needs command, the server every replica runs, e.g. command = "/usr/bin/python3".`)
	} else if d.str("command", a, &s.Command) && strings.TrimSpace(s.Command) == "" {
		d.errorf(a.Expr.Range(), "Invalid command", "command may not be empty.")
	}
	d.strList("args", at["args"], &s.Args)
	d.env(at["env"], &s.Env)
	if _, ok := s.Env["PORT"]; ok {
		d.errorf(at["env"].Expr.Range(), "Conflicting env", "env sets PORT, which gpujob sets to the replica's allocated port; the server must listen on $PORT.")
	}
	if d.str("workdir", at["workdir"], &s.Workdir) && !path.IsAbs(s.Workdir) {
		d.errorf(at["workdir"].Expr.Range(), "Invalid workdir", "workdir must be an absolute path on the clients, got %q.", s.Workdir)
	}
	if d.str("version", at["version"], &s.Version) && !validVersion.MatchString(s.Version) {
		d.errorf(at["version"].Expr.Range(), "Invalid version", "%q is not a version label: 1 to 63 letters, digits, dots, dashes and underscores, starting with a letter or digit.", s.Version)
	}
	d.placement(at, &s.Datacenters, &s.NodePool, &s.Namespace, &s.Priority, &s.Meta)
	d.queue(at["queue"], &s.Queue)

	if blk := d.singleBlock(c.Blocks, "replicas"); blk != nil {
		d.replicas(blk, &s.Replicas)
	}
	if blk := d.singleBlock(c.Blocks, "health"); blk != nil {
		d.health(blk, &s.Health)
	}
	if blk := d.singleBlock(c.Blocks, "update"); blk != nil {
		d.update(blk, &s.Update, s.Replicas.Max)
	}
	if blk := d.singleBlock(c.Blocks, "autoscale"); blk != nil {
		s.Autoscale = d.autoscale(blk)
		if s.Replicas.Min == s.Replicas.Max {
			d.errorf(blk.DefRange, "Autoscale without room", "autoscale sets the count between replicas.min and replicas.max, which are both %d: widen replicas { min max } or remove autoscale.", s.Replicas.Min)
		}
	} else if s.Replicas.Min != s.Replicas.Max {
		d.errorf(s.Ranges.Of("replicas"), "Replicas range without autoscale",
			"replicas.min (%d) and replicas.max (%d) differ, but nothing moves the count between them: add autoscale { target_inflight = N } or make them equal.", s.Replicas.Min, s.Replicas.Max)
	}
	if blk := d.singleBlock(c.Blocks, "route"); blk != nil {
		d.route(blk, &s.Route)
	}
	if s.Route.Path == "" {
		s.Route.Path = "/" + s.Name
	}
	if blk := d.singleBlock(c.Blocks, "resources"); blk != nil {
		d.resources(blk, &s.Resources)
	}
	if blk := d.singleBlock(c.Blocks, "gpu"); blk != nil {
		s.GPU = d.gpu(blk, s.GPUsPerReplica, "gpus_per_replica")
	}
	if s.Version == "" {
		s.Version = s.digest()
	}
	return s, d.diags
}

func (d *decoder) replicas(blk *hcl.Block, r *Replicas) {
	d.attrs["replicas"] = blk.DefRange
	c := d.content(blk, replicasSchema)
	at := c.Attributes
	minSet := d.int("replicas.min", at["min"], &r.Min)
	maxSet := d.int("replicas.max", at["max"], &r.Max)
	initSet := d.int("replicas.initial", at["initial"], &r.Initial)
	// One given number stands for the others left out: replicas { min = 2 }
	// is 2 replicas, not 2 to 1.
	switch {
	case minSet && !maxSet:
		r.Max = max(r.Min, 1)
	case maxSet && !minSet:
		r.Min = min(r.Max, 1)
	}
	if !initSet {
		r.Initial = max(r.Min, min(1, r.Max))
	}
	rng := func(name string) hcl.Range { return d.rangeOr("replicas."+name, blk.DefRange) }
	switch {
	case r.Min < 0:
		d.errorf(rng("min"), "Invalid replicas.min", "replicas.min must be 0 (scale to zero) or more, got %d.", r.Min)
	case r.Max < 1 || r.Max > MaxReplicas:
		d.errorf(rng("max"), "Invalid replicas.max", "replicas.max must be between 1 and %d, got %d.", MaxReplicas, r.Max)
	case r.Min > r.Max:
		d.errorf(rng("min"), "Invalid replicas", "replicas.min (%d) is above replicas.max (%d).", r.Min, r.Max)
	case r.Initial < r.Min || r.Initial > r.Max:
		d.errorf(rng("initial"), "Invalid replicas.initial", "replicas.initial (%d) must lie between min (%d) and max (%d).", r.Initial, r.Min, r.Max)
	}
}

func (d *decoder) health(blk *hcl.Block, h *Health) {
	d.attrs["health"] = blk.DefRange
	c := d.content(blk, healthSchema)
	at := c.Attributes
	if d.str("health.path", at["path"], &h.Path) && (!strings.HasPrefix(h.Path, "/") || strings.ContainsAny(h.Path, " \t\r\n")) {
		d.errorf(at["path"].Expr.Range(), "Invalid health.path", "health.path must be an absolute URL path such as \"/healthz\", got %q.", h.Path)
	}
	d.duration("health.interval", at["interval"], &h.Interval, false)
	d.duration("health.timeout", at["timeout"], &h.Timeout, false)
	d.duration("health.initial_delay", at["initial_delay"], &h.InitialDelay, true)
	if h.Interval < time.Second && at["interval"] != nil {
		d.errorf(at["interval"].Expr.Range(), "Invalid health.interval", "health.interval must be at least 1s (Nomad's minimum for a check), got %s.", h.Interval)
	}
	if h.Timeout < time.Second && at["timeout"] != nil {
		d.errorf(at["timeout"].Expr.Range(), "Invalid health.timeout", "health.timeout must be at least 1s (Nomad's minimum for a check), got %s.", h.Timeout)
	}
	if h.Timeout > h.Interval {
		d.errorf(d.rangeOr("health.timeout", blk.DefRange), "Invalid health.timeout", "health.timeout (%s) is longer than health.interval (%s).", h.Timeout, h.Interval)
	}
}

func (d *decoder) update(blk *hcl.Block, u *Update, maxReplicas int) {
	d.attrs["update"] = blk.DefRange
	c := d.content(blk, updateSchema)
	at := c.Attributes
	if d.int("update.canary", at["canary"], &u.Canary) && (u.Canary < 0 || u.Canary > maxReplicas) {
		d.errorf(at["canary"].Expr.Range(), "Invalid update.canary", "update.canary must be between 0 and replicas.max (%d), got %d.", maxReplicas, u.Canary)
	}
	if d.int("update.max_parallel", at["max_parallel"], &u.MaxParallel) && u.MaxParallel < 1 {
		d.errorf(at["max_parallel"].Expr.Range(), "Invalid update.max_parallel", "update.max_parallel must be at least 1, got %d.", u.MaxParallel)
	}
	// Canaries are promoted once healthy unless the spec says otherwise:
	// gpujob has no promote command of its own (nomad deployment promote).
	u.AutoPromote = u.Canary > 0
	d.bool("update.auto_promote", at["auto_promote"], &u.AutoPromote)
	d.bool("update.auto_revert", at["auto_revert"], &u.AutoRevert)
	d.duration("update.min_healthy_time", at["min_healthy_time"], &u.MinHealthyTime, false)
	if u.AutoPromote && u.Canary == 0 && at["auto_promote"] != nil {
		d.errorf(at["auto_promote"].Expr.Range(), "auto_promote without canaries", "update.auto_promote promotes canaries, but update.canary is 0: set canary = 1 or more, or remove auto_promote.")
	}
}

func (d *decoder) autoscale(blk *hcl.Block) *Autoscale {
	d.attrs["autoscale"] = blk.DefRange
	c := d.content(blk, autoscaleSchema)
	at := c.Attributes
	a := &Autoscale{ScaleDownDelay: DefaultScaleDownDelay}
	if v, ok := d.value("autoscale.target_inflight", at["target_inflight"], cty.Number); ok {
		f, _ := v.AsBigFloat().Float64()
		if f <= 0 || math.IsInf(f, 0) {
			d.errorf(at["target_inflight"].Expr.Range(), "Invalid autoscale.target_inflight", "autoscale.target_inflight is the requests in flight per replica to aim for and must be more than 0.")
		}
		a.TargetInflight = f
	}
	d.duration("autoscale.scale_up_delay", at["scale_up_delay"], &a.ScaleUpDelay, true)
	d.duration("autoscale.scale_down_delay", at["scale_down_delay"], &a.ScaleDownDelay, true)
	return a
}

func (d *decoder) route(blk *hcl.Block, r *Route) {
	d.attrs["route"] = blk.DefRange
	c := d.content(blk, routeSchema)
	at := c.Attributes
	if d.str("route.path", at["path"], &r.Path) {
		if !validRoutePath.MatchString(r.Path) || strings.Contains(r.Path+"/", "/./") || strings.Contains(r.Path+"/", "/../") {
			d.errorf(at["path"].Expr.Range(), "Invalid route.path", "route.path must be a path prefix of plain segments such as \"/bert\" or \"/models/bert\" (no trailing slash), got %q.", r.Path)
		}
		for _, res := range reservedRoutes {
			if r.Path == res || strings.HasPrefix(r.Path, res+"/") {
				d.errorf(at["path"].Expr.Range(), "Reserved route.path", "%s is the gateway's own; choose another route.path.", res)
			}
		}
	}
	if d.str("route.host", at["host"], &r.Host) && !validHost.MatchString(r.Host) {
		d.errorf(at["host"].Expr.Range(), "Invalid route.host", "route.host must be a host name such as \"bert.example.com\" (no port), got %q.", r.Host)
	}
	d.bool("route.auth", at["auth"], &r.Auth)
	if d.bool("route.traefik", at["traefik"], &r.Traefik) && r.Traefik && r.Auth {
		d.errorf(at["traefik"].Expr.Range(), "Traefik route with auth", "route.traefik adds tags that have Traefik route to the replicas without the gateway's tokens, but route.auth is true: set auth = false, or leave Traefik out.")
	}
	d.duration("route.timeout", at["timeout"], &r.Timeout, true)
	if d.int("route.queue_limit", at["queue_limit"], &r.QueueLimit) && r.QueueLimit < 0 {
		d.errorf(at["queue_limit"].Expr.Range(), "Invalid route.queue_limit", "route.queue_limit must be 0 (no request held) or more, got %d.", r.QueueLimit)
	}
	d.duration("route.queue_timeout", at["queue_timeout"], &r.QueueTimeout, false)
	var maxBody string
	if d.str("route.max_body", at["max_body"], &maxBody) {
		n, err := servekv.ParseSize(maxBody)
		switch {
		case err != nil:
			d.errorf(at["max_body"].Expr.Range(), "Invalid route.max_body", "route.max_body: %v.", err)
		case n < 1 || n > MaxRouteBody:
			d.errorf(at["max_body"].Expr.Range(), "Invalid route.max_body",
				"route.max_body is the largest request body the gateway takes for the route, between 1 byte and 1GiB (the gateway buffers it whole), got %s.", maxBody)
		default:
			r.MaxBodyBytes = n
		}
	}
	if rb := d.singleBlock(c.Blocks, "rate_limit"); rb != nil {
		d.attrs["route.rate_limit"] = rb.DefRange
		rc := d.content(rb, rateLimitSchema)
		rl := &RateLimit{}
		if v, ok := d.value("route.rate_limit.rps", rc.Attributes["rps"], cty.Number); ok {
			rl.RPS, _ = v.AsBigFloat().Float64()
			if rl.RPS <= 0 || math.IsInf(rl.RPS, 0) {
				d.errorf(rc.Attributes["rps"].Expr.Range(), "Invalid rate_limit.rps", "rate_limit.rps must be more than 0 requests per second.")
			}
		}
		rl.Burst = int(math.Ceil(rl.RPS))
		if d.int("route.rate_limit.burst", rc.Attributes["burst"], &rl.Burst) && rl.Burst < 1 {
			d.errorf(rc.Attributes["burst"].Expr.Range(), "Invalid rate_limit.burst", "rate_limit.burst must be at least 1, got %d.", rl.Burst)
		}
		r.RateLimit = rl
	}
}

// rangeOr is the range of the attribute at path, or def when it is unset.
func (d *decoder) rangeOr(path string, def hcl.Range) hcl.Range {
	if r, ok := d.attrs[path]; ok {
		return r
	}
	return def
}

// digest is the default version: what a replica runs, hashed.
func (s *Service) digest() string {
	b, _ := json.Marshal(struct {
		Command string
		Args    []string
		Env     map[string]string
		Workdir string
		GPUs    int
		Res     Resources
	}{s.Command, s.Args, s.Env, s.Workdir, s.GPUsPerReplica, s.Resources})
	sum := sha256.Sum256(b)
	return "v-" + hex.EncodeToString(sum[:4])
}

// String is a one-line summary.
func (s *Service) String() string {
	return fmt.Sprintf("service %s: %d-%d replicas x %d GPU, route %s", s.Name, s.Replicas.Min, s.Replicas.Max, s.GPUsPerReplica, s.Route.Path)
}
