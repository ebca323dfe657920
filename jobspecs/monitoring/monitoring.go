// Package monitoring holds gpujob's Prometheus alert rules, Grafana dashboard
// and dev-cluster Prometheus configuration (the files of this folder,
// embedded), and helpers to use them: every PromQL expression they contain
// (Exprs), a rendered Prometheus configuration (RenderPrometheusConfig), the
// rules with short `for:` durations for tests (ShortenFor), and the file_sd
// targets of Consul services for Prometheus builds without Consul service
// discovery (SyncConsulFileSD).
package monitoring

import (
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// The embedded files' names.
const (
	RulesFile          = "gpujob-alerts.yml"
	RulesTestFile      = "gpujob-alerts.test.yml"
	DashboardFile      = "grafana-dashboard.json"
	ConfigFile         = "prometheus.yml"           // file_sd (Debian's prometheus 2.42)
	ConsulSDConfigFile = "prometheus-consul-sd.yml" // consul_sd_configs (upstream builds)
	ExporterService    = "gpujob-exporter"          // Consul service and scrape job of the exporters
	// GatewayService is the Consul service of the gateways' admin
	// listeners (/metrics is not on the port they route on) and their
	// scrape job.
	GatewayService       = "gpujob-gateway-admin"
	placeholderFileSDDir = "{{FILE_SD_DIR}}"
	placeholderConsul    = "{{CONSUL_ADDR}}"
	placeholderToken     = "{{CONSUL_TOKEN}}"
)

// Files holds the embedded files, by the names above.
//
//go:embed gpujob-alerts.yml gpujob-alerts.test.yml grafana-dashboard.json prometheus.yml prometheus-consul-sd.yml
var Files embed.FS

func mustRead(name string) []byte {
	b, err := Files.ReadFile(name)
	if err != nil {
		panic(err) // embedded: cannot happen
	}
	return b
}

// Rules returns the alert rule file (gpujob-alerts.yml).
func Rules() []byte { return mustRead(RulesFile) }

// Dashboard returns the Grafana dashboard (grafana-dashboard.json).
func Dashboard() []byte { return mustRead(DashboardFile) }

// KnownMetrics are the metric names the rules and the dashboard may use: the
// exporter's (DCGM-exporter compatible DCGM_FI_DEV_* and gpujob_*) and the
// gateway's, as the observability design fixes them, histograms with their
// _bucket, _sum and _count series. Sorted.
var KnownMetrics = []string{
	"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
	"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
	"DCGM_FI_DEV_FB_FREE",
	"DCGM_FI_DEV_FB_USED",
	"DCGM_FI_DEV_GPU_TEMP",
	"DCGM_FI_DEV_GPU_UTIL",
	"DCGM_FI_DEV_MEM_COPY_UTIL",
	"DCGM_FI_DEV_POWER_USAGE",
	"DCGM_FI_DEV_SM_CLOCK",
	"DCGM_FI_DEV_XID_ERRORS",
	"gpujob_exporter_cluster",
	"gpujob_exporter_requests_total",
	"gpujob_exporter_snapshot_seconds",
	"gpujob_exporter_up",
	"gpujob_gateway_endpoints",
	"gpujob_gateway_inflight",
	"gpujob_gateway_queued",
	"gpujob_gateway_request_duration_seconds_bucket",
	"gpujob_gateway_request_duration_seconds_count",
	"gpujob_gateway_request_duration_seconds_sum",
	"gpujob_gateway_requests_total",
	"gpujob_gpu_health_changes_total",
	"gpujob_gpu_healthy",
	"gpujob_gpu_xid_errors_total",
	"gpujob_queue_admission_latency_seconds_bucket",
	"gpujob_queue_admission_latency_seconds_count",
	"gpujob_queue_admission_latency_seconds_sum",
	"gpujob_queue_admissions_total",
	"gpujob_queue_allocations",
	"gpujob_queue_borrowed_gpus",
	"gpujob_queue_jobs",
	"gpujob_queue_oldest_wait_seconds",
	"gpujob_queue_preempted_jobs",
	"gpujob_queue_preemptions_total",
	"gpujob_queue_quota_gpus",
	"gpujob_queue_refusals_total",
	"gpujob_queue_refused_jobs",
	"gpujob_queue_used_gpus",
	"gpujob_queue_wait_seconds",
	"gpujob_queue_waiting_gpus",
	"gpujob_queue_waiting_jobs",
	"gpujob_rendezvous_round",
	"gpujob_rendezvous_round_seconds",
	"gpujob_sweep_best",
	"gpujob_sweep_progress",
	"gpujob_sweep_running",
	"gpujob_sweep_trials",
	"gpujob_train_loss",
	"gpujob_train_members",
	"gpujob_train_restarts_max",
	"gpujob_train_restarts_total",
	"gpujob_train_step",
	"gpujob_train_workers",
}

// Expr is one PromQL expression of the rules or the dashboard.
type Expr struct {
	File   string // RulesFile or DashboardFile
	Origin string // `alert GPUJobLowGPUUtilization`, `panel "GPU power" target A`, `variable Hostname`
	Raw    string // as written, Grafana variables included
	PromQL string // Substitute(Raw): what Prometheus accepts
}

func (e Expr) String() string { return e.File + ": " + e.Origin }

// Exprs returns every PromQL expression of the rule file (each rule's expr)
// and of the dashboard (each panel target's expr, and the metric selector of
// each `label_values(selector, label)` variable query), in file order.
func Exprs() ([]Expr, error) {
	var out []Expr
	var rf struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert  string `yaml:"alert"`
				Record string `yaml:"record"`
				Expr   string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(Rules(), &rf); err != nil {
		return nil, fmt.Errorf("%s: %w", RulesFile, err)
	}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			origin := "alert " + r.Alert
			if r.Alert == "" {
				origin = "record " + r.Record
			}
			raw := strings.TrimSpace(r.Expr)
			if raw == "" {
				return nil, fmt.Errorf("%s: %s: no expr", RulesFile, origin)
			}
			out = append(out, Expr{File: RulesFile, Origin: origin, Raw: raw, PromQL: Substitute(raw)})
		}
	}

	d, err := parseDashboard(Dashboard())
	if err != nil {
		return nil, err
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q := v.queryString()
		sel, ok := labelValuesSelector(q)
		if !ok {
			return nil, fmt.Errorf("%s: variable %s: query %q is not label_values(selector, label)", DashboardFile, v.Name, q)
		}
		if sel != "" {
			out = append(out, Expr{File: DashboardFile, Origin: "variable " + v.Name, Raw: sel, PromQL: Substitute(sel)})
		}
	}
	for _, p := range d.allPanels() {
		for _, t := range p.Targets {
			raw := strings.TrimSpace(t.Expr)
			if raw == "" {
				return nil, fmt.Errorf("%s: panel %q target %s: no expr", DashboardFile, p.Title, t.RefID)
			}
			out = append(out, Expr{File: DashboardFile, Origin: fmt.Sprintf("panel %q target %s", p.Title, t.RefID), Raw: raw, PromQL: Substitute(raw)})
		}
	}
	return out, nil
}

// dashboard is what this package reads of a Grafana dashboard.
type dashboard struct {
	Title         string                    `json:"title"`
	UID           string                    `json:"uid"`
	SchemaVersion int                       `json:"schemaVersion"`
	Panels        []panel                   `json:"panels"`
	Templating    struct{ List []variable } `json:"templating"`
}

type panel struct {
	ID         int             `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource *datasource     `json:"datasource"`
	Targets    []target        `json:"targets"`
	Panels     []panel         `json:"panels"` // a collapsed row's
	GridPos    json.RawMessage `json:"gridPos"`
}

type target struct {
	RefID      string      `json:"refId"`
	Expr       string      `json:"expr"`
	Datasource *datasource `json:"datasource"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"`
	Datasource *datasource     `json:"datasource"`
	AllValue   string          `json:"allValue"`
}

// queryString is a query variable's query: a string, or {"query": "..."}.
func (v variable) queryString() string {
	var s string
	if json.Unmarshal(v.Query, &s) == nil {
		return s
	}
	var o struct {
		Query string `json:"query"`
	}
	_ = json.Unmarshal(v.Query, &o)
	return o.Query
}

func parseDashboard(b []byte) (*dashboard, error) {
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", DashboardFile, err)
	}
	return &d, nil
}

// allPanels lists the panels, those of collapsed rows included, rows left out.
func (d *dashboard) allPanels() []panel {
	var out []panel
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if p.Type != "row" {
				out = append(out, p)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

var labelValuesRE = regexp.MustCompile(`^label_values\(\s*(?:(.*\S)\s*,\s*)?([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$`)

// labelValuesSelector returns the selector of a Grafana label_values query
// ("" for label_values(label)).
func labelValuesSelector(q string) (string, bool) {
	m := labelValuesRE.FindStringSubmatch(strings.TrimSpace(q))
	if m == nil {
		return "", false
	}
	return m[1], true
}

// Grafana's built-in interval variables and the values Substitute gives them.
var builtinValues = map[string]string{
	"__rate_interval": "1m",
	"__interval":      "1m",
	"__interval_ms":   "60000",
	"__range":         "1h",
	"__range_s":       "3600",
	"__range_ms":      "3600000",
}

var grafanaVarRE = regexp.MustCompile(`\$\{([a-zA-Z_][a-zA-Z0-9_]*)(?::[a-zA-Z]+)?\}|\$([a-zA-Z_][a-zA-Z0-9_]*)|\[\[([a-zA-Z_][a-zA-Z0-9_]*)\]\]`)

// Substitute replaces the Grafana template variables of a dashboard
// expression with values Prometheus accepts, as Grafana would with "All"
// selected: $__rate_interval, $__interval and $__range become 1m, 1m and 1h
// ($__interval_ms 60000, $__range_s 3600, $__range_ms 3600000); any other
// variable ($Hostname, ${nomad_job}, ${service:regex}, [[var]]) becomes .*
// — which is only right inside a regular-expression matcher (=~ or !~),
// where the dashboard uses them. Expressions without variables come back
// unchanged.
func Substitute(expr string) string {
	return grafanaVarRE.ReplaceAllStringFunc(expr, func(m string) string {
		sm := grafanaVarRE.FindStringSubmatch(m)
		name := sm[1] + sm[2] + sm[3]
		if v, ok := builtinValues[name]; ok {
			return v
		}
		return ".*"
	})
}

// forLineRE is a rule's `for:` line of the rule file.
var forLineRE = regexp.MustCompile(`(?m)^(\s+for:[ \t]*)[^\s#]+`)

// ShortenFor returns the rule file rules with every `for:` duration set to
// d (a Prometheus duration such as "10s"), so that an end-to-end test sees
// an alert fire within seconds (the low utilisation alert waits 10m
// otherwise). Rules without a `for:` are left so. For tests only: alerts that
// fire at the first bad sample are noise.
func ShortenFor(rules []byte, d string) []byte {
	return forLineRE.ReplaceAll(rules, []byte("${1}"+d))
}

// ConfigOptions are RenderPrometheusConfig's.
type ConfigOptions struct {
	// FileSDDir, when set, selects prometheus.yml: file_sd_configs reading
	// FileSDDir/gpujob-exporter.json and FileSDDir/gpujob-gateway.json,
	// which SyncConsulFileSD keeps up to date; for Prometheus builds
	// without Consul service discovery, such as Debian's 2.42.
	FileSDDir string
	// ConsulAddr (host:port of Consul's HTTP API), when FileSDDir is
	// empty, selects prometheus-consul-sd.yml: consul_sd_configs.
	ConsulAddr string
	// ConsulToken is the ACL token of consul_sd_configs ("" for none).
	ConsulToken string
	// RulesPath is where the rule file is; "" leaves gpujob-alerts.yml,
	// read from the configuration file's folder.
	RulesPath string
}

// RenderPrometheusConfig returns the dev cluster's Prometheus configuration
// (scrape jobs gpujob-exporter and gpujob-gateway every 5 s, the alert rules
// evaluated every 5 s) with its placeholders filled in from o.
func RenderPrometheusConfig(o ConfigOptions) ([]byte, error) {
	var s string
	switch {
	case o.FileSDDir != "":
		if err := checkValue("FileSDDir", o.FileSDDir); err != nil {
			return nil, err
		}
		s = strings.ReplaceAll(string(mustRead(ConfigFile)), placeholderFileSDDir, strings.TrimRight(o.FileSDDir, "/"))
	case o.ConsulAddr != "":
		if err := checkValue("ConsulAddr", o.ConsulAddr); err != nil {
			return nil, err
		}
		if err := checkValue("ConsulToken", o.ConsulToken); err != nil {
			return nil, err
		}
		s = string(mustRead(ConsulSDConfigFile))
		s = strings.ReplaceAll(s, placeholderConsul, o.ConsulAddr)
		s = strings.ReplaceAll(s, placeholderToken, o.ConsulToken)
	default:
		return nil, errors.New("monitoring: RenderPrometheusConfig needs FileSDDir or ConsulAddr")
	}
	if o.RulesPath != "" {
		if err := checkValue("RulesPath", o.RulesPath); err != nil {
			return nil, err
		}
		old := `- "` + RulesFile + `"`
		if !strings.Contains(s, old) {
			return nil, errors.New("monitoring: no rule_files entry to replace") // the embedded file changed
		}
		s = strings.Replace(s, old, "- "+strconv.Quote(o.RulesPath), 1)
	}
	return []byte(s), nil
}

// checkValue refuses what cannot go inside a double-quoted YAML string as is.
func checkValue(name, v string) error {
	if strings.ContainsAny(v, "\"\\\n\r\t") {
		return fmt.Errorf("monitoring: %s %q: quotes, backslashes and control characters are not allowed", name, v)
	}
	return nil
}

// promqlKeywords are the words of PromQL that are not metric names.
var promqlKeywords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"and": true, "or": true, "unless": true, "offset": true, "bool": true, "inf": true, "nan": true, "atan2": true,
	// Aggregations, which may be followed by by/without rather than "(".
	"sum": true, "avg": true, "min": true, "max": true, "count": true, "group": true, "stddev": true, "stdvar": true,
	"topk": true, "bottomk": true, "quantile": true, "count_values": true,
}

// MetricNames returns the metric names an expression selects, sorted and
// without repeats: the identifiers that are neither a function, a keyword,
// a label (in braces or in a by/without/on/ignoring/group_* list), nor part
// of a string, a number or a duration. It is a lexer, not a parser: enough
// to catch a misspelt metric name.
func MetricNames(expr string) []string {
	seen := map[string]bool{}
	r := []rune(expr)
	depthBrace, depthBracket := 0, 0
	labelList := 0 // depth of parentheses after by/without/on/...
	parens := []bool{}
	prevWord := ""
	for i := 0; i < len(r); {
		c := r[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			for j < len(r) && r[j] != c {
				if r[j] == '\\' && c != '`' {
					j++
				}
				j++
			}
			i = j + 1
			prevWord = ""
			continue
		case c == '#':
			for i < len(r) && r[i] != '\n' {
				i++
			}
			continue
		case c == '{':
			depthBrace++
		case c == '}':
			depthBrace--
		case c == '[':
			depthBracket++
		case c == ']':
			depthBracket--
		case c == '(':
			isList := prevWord == "by" || prevWord == "without" || prevWord == "on" || prevWord == "ignoring" ||
				prevWord == "group_left" || prevWord == "group_right"
			parens = append(parens, isList)
			if isList {
				labelList++
			}
		case c == ')':
			if n := len(parens); n > 0 {
				if parens[n-1] {
					labelList--
				}
				parens = parens[:n-1]
			}
		case c >= '0' && c <= '9' || c == '.':
			// A number or a duration (5m, 1h30m, 1e3, 0x1f): skip its letters too.
			j := i
			for j < len(r) && (isIdent(r[j]) || r[j] == '.') {
				j++
			}
			i = j
			prevWord = ""
			continue
		case isIdentStart(c):
			j := i
			for j < len(r) && isIdent(r[j]) {
				j++
			}
			w := string(r[i:j])
			k := j
			for k < len(r) && (r[k] == ' ' || r[k] == '\t' || r[k] == '\n' || r[k] == '\r') {
				k++
			}
			isCall := k < len(r) && r[k] == '('
			if depthBrace == 0 && depthBracket == 0 && labelList == 0 && !isCall && !promqlKeywords[strings.ToLower(w)] {
				seen[w] = true
			}
			prevWord = strings.ToLower(w)
			i = j
			continue
		}
		if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			prevWord = ""
		}
		i++
	}
	out := make([]string, 0, len(seen))
	for w := range seen {
		out = append(out, w)
	}
	sort.Strings(out)
	return out
}

func isIdentStart(c rune) bool {
	return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

func isIdent(c rune) bool { return isIdentStart(c) || c >= '0' && c <= '9' }
