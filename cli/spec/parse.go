package spec

import (
	"fmt"
	"math/big"
	"path"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"

	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/pylaunch"
	"github.com/gpujob/gpujob/internal/queue/queuefile"
	"github.com/gpujob/gpujob/internal/safename"
)

var fileSchema = &hcl.BodySchema{
	Blocks: []hcl.BlockHeaderSchema{
		{Type: "variable", LabelNames: []string{"name"}},
		{Type: "train", LabelNames: []string{"name"}},
		{Type: "sweep", LabelNames: []string{"name"}},
		{Type: "service", LabelNames: []string{"name"}},
	},
}

// specKinds are the top-level blocks a spec file holds exactly one of.
var specKinds = []string{"train", "sweep", "service"}

var trainSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "workers"},
		{Name: "gpus_per_worker"},
		{Name: "command"},
		{Name: "args"},
		{Name: "env"},
		{Name: "workdir"},
		{Name: "preload"},
		{Name: "image"},
		{Name: "max_failures"},
		{Name: "rendezvous_timeout"},
		{Name: "checkpoint_grace"},
		{Name: "datacenters"},
		{Name: "node_pool"},
		{Name: "namespace"},
		{Name: "priority"},
		{Name: "queue"},
		{Name: "meta"},
	},
	Blocks: []hcl.BlockHeaderSchema{
		{Type: "artifact"},
		{Type: "resources"},
		{Type: "gpu"},
		{Type: "checkpoint"},
		{Type: "image_pull"},
	},
}

var artifactSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "source", Required: true},
		{Name: "destination"},
		{Name: "options"},
	},
}

var resourcesSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{{Name: "cpu"}, {Name: "memory"}, {Name: "shm"}},
}

var gpuSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{{Name: "model"}, {Name: "min_memory"}},
}

var checkpointSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{{Name: "every", Required: true}},
}

var imagePullSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{{Name: "force"}, {Name: "timeout"}},
	Blocks:     []hcl.BlockHeaderSchema{{Type: "auth"}},
}

var authSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{{Name: "username"}, {Name: "password"}, {Name: "server_address"}},
}

// reservedMeta are meta keys gpujob sets on a job (gpujob_run: `gpujob
// submit`, per submission); a spec may set no key gpujob or gpujob_*.
var reservedMeta = contract.ReservedMeta

var (
	validNamespace = regexp.MustCompile(`^[a-zA-Z0-9-]{1,128}$`)
	validNodePool  = regexp.MustCompile(`^[a-zA-Z0-9-_]{1,128}$`)
	validEnvName   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// ParseFile reads the spec at path.
func ParseFile(path string, o Options) (*Train, hcl.Diagnostics) {
	t, _, diags := Load(path, o)
	return t, diags
}

// Parse reads a spec from src; filename names it in diagnostics.
func Parse(src []byte, filename string, o Options) (*Train, hcl.Diagnostics) {
	t, _, diags := LoadSource(src, filename, o)
	return t, diags
}

// Load is ParseFile that also returns every source it read (the spec, the
// -var-files and one pseudo-file per -var), for Format's source excerpts.
func Load(path string, o Options) (*Train, map[string]*hcl.File, hcl.Diagnostics) {
	p, f, diags := parseSpecFile(path)
	return decodeFile(p, f, diags, o)
}

// LoadSource is Parse that also returns the sources it read; see Load.
func LoadSource(src []byte, filename string, o Options) (*Train, map[string]*hcl.File, hcl.Diagnostics) {
	p, f, diags := parseSpecSource(src, filename)
	return decodeFile(p, f, diags, o)
}

// parseSpecFile parses the spec at path, as HCL or, for *.json, as JSON.
func parseSpecFile(path string) (*hclparse.Parser, *hcl.File, hcl.Diagnostics) {
	p := hclparse.NewParser()
	if strings.HasSuffix(path, ".json") {
		f, diags := p.ParseJSONFile(path)
		return p, f, diags
	}
	f, diags := p.ParseHCLFile(path)
	return p, f, diags
}

// parseSpecSource is parseSpecFile on a source already read.
func parseSpecSource(src []byte, filename string) (*hclparse.Parser, *hcl.File, hcl.Diagnostics) {
	p := hclparse.NewParser()
	if strings.HasSuffix(filename, ".json") {
		f, diags := p.ParseJSON(src, filename)
		return p, f, diags
	}
	f, diags := p.ParseHCL(src, filename)
	return p, f, diags
}

func decodeFile(p *hclparse.Parser, f *hcl.File, diags hcl.Diagnostics, o Options) (*Train, map[string]*hcl.File, hcl.Diagnostics) {
	sf, diags := readFile(p, f, diags, o, "train")
	if sf == nil {
		return nil, p.Files(), diags
	}
	ctx := &hcl.EvalContext{
		Variables: map[string]cty.Value{"var": sf.varObj},
		Functions: functions,
	}
	t, d := decodeTrain(sf.block, ctx)
	for _, diag := range d {
		if diag.Summary == "Unknown variable" {
			diag.Detail += " A spec knows only var.<name>; to pass a Nomad runtime variable through to the task, escape it: $${NOMAD_ALLOC_INDEX}."
		}
	}
	diags = append(diags, d...)
	if diags.HasErrors() {
		return nil, p.Files(), diags
	}
	return t, p.Files(), diags
}

// specFile is a parsed spec file: its variables resolved and its one
// top-level block of the kind asked for.
type specFile struct {
	file   *hcl.File
	varObj cty.Value
	block  *hcl.Block
}

// readFile checks f's numbers, decodes its variable blocks, applies o and
// finds its one block of kind ("train" or "sweep"). It returns nil when
// there is no such block (reported) or f did not parse.
func readFile(p *hclparse.Parser, f *hcl.File, diags hcl.Diagnostics, o Options, kind string) (*specFile, hcl.Diagnostics) {
	if f == nil || diags.HasErrors() {
		return nil, diags
	}
	// Numbers too large to evaluate in reasonable time (see maxNumberExp).
	diags = append(diags, checkSourceNumbers(f)...)
	if diags.HasErrors() {
		return nil, diags
	}
	content, d := f.Body.Content(fileSchema)
	diags = append(diags, d...)

	vars := map[string]*variable{}
	blocks := map[string][]*hcl.Block{}
	for _, b := range content.Blocks {
		switch b.Type {
		case "variable":
			v, d := decodeVariable(b)
			diags = append(diags, d...)
			if prev, ok := vars[v.name]; ok {
				diags = append(diags, &hcl.Diagnostic{
					Severity: hcl.DiagError,
					Summary:  "Duplicate variable",
					Detail:   fmt.Sprintf("Variable %q is already declared at %s.", v.name, prev.defRange),
					Subject:  b.DefRange.Ptr(),
				})
				continue
			}
			vars[v.name] = v
		case "train", "sweep", "service":
			blocks[b.Type] = append(blocks[b.Type], b)
		}
	}
	// The blocks of the other kinds, in source order.
	var others []*hcl.Block
	for _, b := range content.Blocks {
		if b.Type != kind && len(blocks[b.Type]) > 0 && b.Type != "variable" {
			others = append(others, b)
		}
	}
	found := blocks[kind]
	switch {
	case len(found) == 0 && len(others) > 0:
		other := others[0].Type
		diags = append(diags, &hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  fmt.Sprintf("A %s spec where a %s spec is expected", other, kind),
			Detail:   fmt.Sprintf(`This file holds a %s block, not a %s "<name>" { … } block; this command reads %s specs only.`, other, kind, kind),
			Subject:  others[0].DefRange.Ptr(),
		})
	case len(found) == 0:
		rng := f.Body.MissingItemRange()
		diags = append(diags, &hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  "Missing " + kind + " block",
			Detail:   fmt.Sprintf(`A spec needs exactly one %s "<name>" { … } block.`, kind),
			Subject:  &rng,
		})
	default:
		for _, b := range found[1:] {
			diags = append(diags, &hcl.Diagnostic{
				Severity: hcl.DiagError,
				Summary:  "Duplicate " + kind + " block",
				Detail:   fmt.Sprintf("A spec holds exactly one %s block; the first is at %s. Put each job in its own file.", kind, found[0].DefRange),
				Subject:  b.DefRange.Ptr(),
			})
		}
		for _, b := range others {
			diags = append(diags, &hcl.Diagnostic{
				Severity: hcl.DiagError,
				Summary:  fmt.Sprintf("Both %s and %s blocks", pairInOrder(kind, b.Type)...),
				Detail:   fmt.Sprintf("A spec holds one train, sweep or service block, not several kinds; the %s block is at %s. Put each in its own file.", kind, found[0].DefRange),
				Subject:  b.DefRange.Ptr(),
			})
		}
	}

	varObj, d := resolveVariables(p, vars, o)
	diags = append(diags, d...)
	if len(found) == 0 {
		return nil, diags
	}
	return &specFile{file: f, varObj: varObj, block: found[0]}, diags
}

// pairInOrder returns two kinds in specKinds' order, so a message names
// them the same way whichever the command reads.
func pairInOrder(a, b string) []any {
	if slices.Index(specKinds, a) > slices.Index(specKinds, b) {
		a, b = b, a
	}
	return []any{a, b}
}

// decoder evaluates attributes, remembering their ranges and collecting
// diagnostics.
type decoder struct {
	ctx   *hcl.EvalContext
	diags hcl.Diagnostics
	attrs map[string]hcl.Range
}

func (d *decoder) errorf(rng hcl.Range, summary, format string, args ...any) {
	d.diags = append(d.diags, &hcl.Diagnostic{
		Severity: hcl.DiagError,
		Summary:  summary,
		Detail:   fmt.Sprintf(format, args...),
		Subject:  rng.Ptr(),
	})
}

func typeError(name string, rng hcl.Range, err error) *hcl.Diagnostic {
	return &hcl.Diagnostic{
		Severity: hcl.DiagError,
		Summary:  "Incorrect attribute value type",
		Detail:   fmt.Sprintf("Inappropriate value for attribute %q: %s.", name, err),
		Subject:  rng.Ptr(),
	}
}

// value evaluates a (nil when absent) and converts it to ty. ok is false
// when the attribute is absent, null, or wrong (then reported).
func (d *decoder) value(path string, a *hcl.Attribute, ty cty.Type) (cty.Value, bool) {
	if a == nil {
		return cty.NilVal, false
	}
	d.attrs[path] = a.Expr.Range()
	v, diags := a.Expr.Value(d.ctx)
	d.diags = append(d.diags, diags...)
	if diags.HasErrors() || v.IsNull() || !v.IsWhollyKnown() {
		// Unknown: a variable without a value, reported already.
		return cty.NilVal, false
	}
	cv, err := convert.Convert(v, ty)
	if err != nil {
		d.diags = append(d.diags, typeError(a.Name, a.Expr.Range(), err))
		return cty.NilVal, false
	}
	if cv.IsNull() || !cv.IsWhollyKnown() {
		return cty.NilVal, false
	}
	return cv, true
}

func (d *decoder) int(path string, a *hcl.Attribute, dst *int) bool {
	v, ok := d.value(path, a, cty.Number)
	if !ok {
		return false
	}
	bf := v.AsBigFloat()
	if !bf.IsInt() {
		d.errorf(a.Expr.Range(), "Incorrect attribute value type", "Inappropriate value for attribute %q: a whole number is required, got %s.", a.Name, numberText(bf))
		return false
	}
	const limit = 1 << 31
	if bf.Cmp(big.NewFloat(limit)) >= 0 || bf.Cmp(big.NewFloat(-limit)) <= 0 {
		d.errorf(a.Expr.Range(), "Value out of range", "Attribute %q: %s is too large.", a.Name, numberText(bf))
		return false
	}
	i, _ := bf.Int64()
	*dst = int(i)
	return true
}

func (d *decoder) str(path string, a *hcl.Attribute, dst *string) bool {
	v, ok := d.value(path, a, cty.String)
	if ok {
		*dst = v.AsString()
	}
	return ok
}

func (d *decoder) bool(path string, a *hcl.Attribute, dst *bool) bool {
	v, ok := d.value(path, a, cty.Bool)
	if ok {
		*dst = v.True()
	}
	return ok
}

func (d *decoder) strList(path string, a *hcl.Attribute, dst *[]string) bool {
	v, ok := d.value(path, a, cty.List(cty.String))
	if !ok {
		return false
	}
	out := make([]string, 0, v.LengthInt())
	for it := v.ElementIterator(); it.Next(); {
		_, e := it.Element()
		if e.IsNull() {
			d.errorf(a.Expr.Range(), "Incorrect attribute value type", "Inappropriate value for attribute %q: element %d is null.", a.Name, len(out))
			return false
		}
		out = append(out, e.AsString())
	}
	*dst = out
	return true
}

func (d *decoder) strMap(path string, a *hcl.Attribute, dst *map[string]string) bool {
	v, ok := d.value(path, a, cty.Map(cty.String))
	if !ok {
		return false
	}
	out := make(map[string]string, v.LengthInt())
	for it := v.ElementIterator(); it.Next(); {
		k, e := it.Element()
		if e.IsNull() {
			d.errorf(a.Expr.Range(), "Incorrect attribute value type", "Inappropriate value for attribute %q: the value of %q is null.", a.Name, k.AsString())
			return false
		}
		out[k.AsString()] = e.AsString()
	}
	*dst = out
	return true
}

// singleBlock returns the only block of typ in blocks, reporting repeats.
func (d *decoder) singleBlock(blocks hcl.Blocks, typ string) *hcl.Block {
	var found *hcl.Block
	for _, b := range blocks {
		if b.Type != typ {
			continue
		}
		if found != nil {
			d.errorf(b.DefRange, "Duplicate "+typ+" block", "Only one %s block is allowed; the first is at %s.", typ, found.DefRange)
			continue
		}
		found = b
	}
	return found
}

func (d *decoder) content(b *hcl.Block, schema *hcl.BodySchema) *hcl.BodyContent {
	c, diags := b.Body.Content(schema)
	d.diags = append(d.diags, diags...)
	return c
}

func decodeTrain(b *hcl.Block, ctx *hcl.EvalContext) (*Train, hcl.Diagnostics) {
	return decodeTrainBody(b, b.Labels[0], b.LabelRanges[0], "train", ctx)
}

// decodeTrainBody decodes the train block b whose job name is name, found at
// nameRange: b's own label, or the label of the sweep (kind) it sits in.
func decodeTrainBody(b *hcl.Block, name string, nameRange hcl.Range, kind string, ctx *hcl.EvalContext) (*Train, hcl.Diagnostics) {
	d := &decoder{ctx: ctx, attrs: map[string]hcl.Range{}}
	t := &Train{
		Name:              name,
		Workers:           DefaultWorkers,
		GPUsPerWorker:     DefaultGPUsPerWorker,
		Resources:         Resources{CPU: DefaultCPU, MemoryMiB: DefaultMemoryMiB},
		MaxFailures:       DefaultMaxFailures,
		RendezvousTimeout: DefaultRendezvousTimeout,
		CheckpointGrace:   DefaultCheckpointGrace,
		Datacenters:       []string{"*"},
		Priority:          DefaultPriority,
	}
	t.Ranges = Ranges{Block: b.DefRange, Name: nameRange, Attrs: d.attrs}
	// The name becomes the Nomad job ID, a directory under the driver's
	// checkpoint_root and a segment of the rendezvous keys in Consul: only
	// names that are their own safe encoding get through, so all three
	// carry it unchanged (the driver encodes whatever else a hand-written
	// job brings).
	d.checkJobName(kind, t.Name, nameRange)

	c := d.content(b, trainSchema)
	at := c.Attributes

	if d.int("workers", at["workers"], &t.Workers) && t.Workers < 1 {
		d.errorf(at["workers"].Expr.Range(), "Invalid workers", "workers must be at least 1, got %d.", t.Workers)
	} else if t.Workers > MaxWorkers {
		d.errorf(at["workers"].Expr.Range(), "Invalid workers", "workers must be at most %d (the driver's limit on a group), got %d.", MaxWorkers, t.Workers)
	}
	if d.int("gpus_per_worker", at["gpus_per_worker"], &t.GPUsPerWorker) && t.GPUsPerWorker < 0 {
		d.errorf(at["gpus_per_worker"].Expr.Range(), "Invalid gpus_per_worker", "gpus_per_worker must be 0 (a CPU job) or more, got %d.", t.GPUsPerWorker)
	}
	if a := at["command"]; a == nil {
		d.errorf(b.DefRange, "Missing required argument", `The train block needs command, the program every rank runs, e.g. command = "/usr/bin/python3".`)
	} else {
		n := len(d.diags)
		ok := d.str("command", a, &t.Command)
		if (ok || len(d.diags) == n) && strings.TrimSpace(t.Command) == "" {
			d.errorf(a.Expr.Range(), "Invalid command", "command may not be empty or null.")
		}
	}
	d.strList("args", at["args"], &t.Args)
	d.env(at["env"], &t.Env)
	if a := at["preload"]; a != nil && d.strList("preload", a, &t.Preload) && len(t.Preload) > 0 {
		for _, m := range t.Preload {
			if !pylaunch.Module(m) {
				d.errorf(a.Expr.Range(), "Invalid preload", "%q is not a Python module name; preload lists modules to import once, e.g. [\"torch\", \"torch.distributed\"].", m)
			}
		}
		if _, err := pylaunch.Parse(t.Command, t.Args); err != nil && t.Command != "" {
			d.errorf(a.Expr.Range(), "Invalid preload", "%s.", err)
		}
	}
	n := len(d.diags)
	if d.str("image", at["image"], &t.Image) {
		switch {
		case strings.TrimSpace(t.Image) == "":
			d.errorf(at["image"].Expr.Range(), "Invalid image", "image may not be empty; leave it out to run the members on the host.")
		case strings.IndexFunc(t.Image, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
			d.errorf(at["image"].Expr.Range(), "Invalid image", "%q is not an image reference: it contains white space or a control character.", t.Image)
		}
	}
	imageBad := len(d.diags) > n
	if blk := d.singleBlock(c.Blocks, "image_pull"); blk != nil {
		t.ImagePull = d.imagePull(blk)
		if t.Image == "" && !imageBad {
			d.errorf(blk.DefRange, "image_pull without image",
				`image_pull { … } says how the docker driver pulls the members' image, but the spec names no image: set image = "REF" or remove the block.`)
		}
	}
	if d.str("workdir", at["workdir"], &t.Workdir) && !path.IsAbs(t.Workdir) {
		d.errorf(at["workdir"].Expr.Range(), "Invalid workdir", "workdir must be an absolute path on the clients (shared storage), got %q.", t.Workdir)
	}
	if d.int("max_failures", at["max_failures"], &t.MaxFailures) && t.MaxFailures < 0 {
		d.errorf(at["max_failures"].Expr.Range(), "Invalid max_failures", "max_failures must be 0 or more, got %d.", t.MaxFailures)
	}
	var timeout string
	if d.str("rendezvous_timeout", at["rendezvous_timeout"], &timeout) {
		dur, err := time.ParseDuration(timeout)
		switch {
		case err != nil:
			d.errorf(at["rendezvous_timeout"].Expr.Range(), "Invalid duration", "rendezvous_timeout %q is not a duration: use a number and a unit, e.g. \"90s\", \"5m\", \"1h\".", timeout)
		case dur <= 0:
			d.errorf(at["rendezvous_timeout"].Expr.Range(), "Invalid duration", "rendezvous_timeout must be positive, got %q.", timeout)
		default:
			t.RendezvousTimeout = dur
		}
	}
	var grace string
	if a := at["checkpoint_grace"]; d.str("checkpoint_grace", a, &grace) {
		dur, err := time.ParseDuration(grace)
		switch {
		case err != nil:
			d.errorf(a.Expr.Range(), "Invalid duration", "checkpoint_grace %q is not a duration: use a number and a unit, e.g. \"30s\", \"2m\".", grace)
		case dur < time.Second || dur > MaxCheckpointGrace:
			d.errorf(a.Expr.Range(), "Invalid checkpoint_grace", "checkpoint_grace must be between 1s and 10m (a stopping job holds its GPUs that long), got %q.", grace)
		default:
			t.CheckpointGrace = dur
		}
	}
	d.placement(at, &t.Datacenters, &t.NodePool, &t.Namespace, &t.Priority, &t.Meta)
	d.queue(at["queue"], &t.Queue)

	for _, blk := range c.Blocks {
		if blk.Type == "artifact" {
			t.Artifacts = append(t.Artifacts, d.artifact(blk, len(t.Artifacts)))
		}
	}
	if blk := d.singleBlock(c.Blocks, "resources"); blk != nil {
		d.resources(blk, &t.Resources)
	}
	if blk := d.singleBlock(c.Blocks, "gpu"); blk != nil {
		t.GPU = d.gpu(blk, t.GPUsPerWorker, "gpus_per_worker")
	}
	if blk := d.singleBlock(c.Blocks, "checkpoint"); blk != nil {
		d.attrs["checkpoint"] = blk.DefRange
		cc := d.content(blk, checkpointSchema)
		a := cc.Attributes["every"]
		if d.int("checkpoint.every", a, &t.CheckpointEvery) && t.CheckpointEvery < 1 {
			d.errorf(a.Expr.Range(), "Invalid checkpoint.every", "checkpoint.every is in steps and must be at least 1, got %d.", t.CheckpointEvery)
		}
		if _, ok := t.Env[EnvCheckpointEvery]; ok {
			d.errorf(at["env"].Expr.Range(), "Conflicting env", "env sets %s, which checkpoint { every } sets too; keep one.", EnvCheckpointEvery)
		}
	}

	t.Ranges.Workers = t.Ranges.Of("workers")
	t.Ranges.GPUsPerWorker = t.Ranges.Of("gpus_per_worker")
	return t, d.diags
}

// env decodes an env map, refusing names that are no variable's.
func (d *decoder) env(a *hcl.Attribute, dst *map[string]string) {
	if d.strMap("env", a, dst) {
		for _, k := range sortedKeys(*dst) {
			if !validEnvName.MatchString(k) {
				d.errorf(a.Expr.Range(), "Invalid env", "%q is not an environment variable name (letters, digits and underscores, not starting with a digit).", k)
			}
		}
	}
}

// placement decodes where and how a job is placed: datacenters, node_pool,
// namespace, priority and meta.
func (d *decoder) placement(at hcl.Attributes, dcs *[]string, pool, ns *string, prio *int, meta *map[string]string) {
	if d.strList("datacenters", at["datacenters"], dcs) {
		if len(*dcs) == 0 {
			d.errorf(at["datacenters"].Expr.Range(), "Invalid datacenters", `datacenters needs at least one datacenter; ["*"] means all.`)
		}
		for _, dc := range *dcs {
			if dc == "" {
				d.errorf(at["datacenters"].Expr.Range(), "Invalid datacenters", "a datacenter name may not be empty.")
				break
			}
		}
	}
	if d.str("node_pool", at["node_pool"], pool) && !validNodePool.MatchString(*pool) {
		d.errorf(at["node_pool"].Expr.Range(), "Invalid node_pool", "%q is not a node pool name: 1 to 128 letters, digits, dashes and underscores.", *pool)
	}
	if d.str("namespace", at["namespace"], ns) && !validNamespace.MatchString(*ns) {
		d.errorf(at["namespace"].Expr.Range(), "Invalid namespace", "%q is not a namespace name: 1 to 128 letters, digits and dashes.", *ns)
	}
	if d.int("priority", at["priority"], prio) && (*prio < MinPriority || *prio > MaxPriority) {
		d.errorf(at["priority"].Expr.Range(), "Invalid priority", "priority must be between %d and %d, got %d.", MinPriority, MaxPriority, *prio)
	}
	if d.strMap("meta", at["meta"], meta) {
		for _, k := range sortedKeys(*meta) {
			if k == "gpujob" || strings.HasPrefix(k, "gpujob_") {
				d.errorf(at["meta"].Expr.Range(), "Reserved meta key", "meta key %q: gpujob and gpujob_* are set by gpujob itself (%s, …); choose another name.", k, strings.Join(reservedMeta, ", "))
			}
		}
	}
}

// queue decodes a job's queue: a valid queue name. Whether the queue
// exists is for submit to check, against the configuration in Consul.
func (d *decoder) queue(a *hcl.Attribute, dst *string) {
	if d.str("queue", a, dst) {
		if err := queuefile.CheckName(*dst); err != nil {
			d.errorf(a.Expr.Range(), "Invalid queue", "%s.", err)
		}
	}
}

// resources decodes a resources block into dst (which holds the defaults).
func (d *decoder) resources(blk *hcl.Block, dst *Resources) {
	d.attrs["resources"] = blk.DefRange
	rc := d.content(blk, resourcesSchema)
	for _, f := range []struct {
		name string
		dst  *int
		min  int
		why  string
	}{
		{"cpu", &dst.CPU, MinCPU, "MHz"},
		{"memory", &dst.MemoryMiB, MinMemoryMiB, "MiB (Nomad's minimum)"},
		{"shm", &dst.ShmMiB, 0, "MiB"},
	} {
		a := rc.Attributes[f.name]
		if d.int("resources."+f.name, a, f.dst) && *f.dst < f.min {
			d.errorf(a.Expr.Range(), "Invalid resources."+f.name, "resources.%s must be at least %d %s, got %d.", f.name, f.min, f.why, *f.dst)
		}
	}
}

// gpu decodes a gpu block; gpus is how many GPUs the job asks for, in the
// attribute countAttr.
func (d *decoder) gpu(blk *hcl.Block, gpus int, countAttr string) *GPU {
	d.attrs["gpu"] = blk.DefRange
	gc := d.content(blk, gpuSchema)
	g := &GPU{}
	if d.str("gpu.model", gc.Attributes["model"], &g.Model) && g.Model == "" {
		d.errorf(gc.Attributes["model"].Expr.Range(), "Invalid gpu.model", "model may not be empty; leave it out to accept any model.")
	}
	var mem string
	if d.str("gpu.min_memory", gc.Attributes["min_memory"], &mem) {
		mib, err := ParseMemory(mem)
		if err != nil {
			d.errorf(gc.Attributes["min_memory"].Expr.Range(), "Invalid gpu.min_memory", "%s.", err)
		}
		g.MinMemoryMiB = mib
	}
	if gpus == 0 {
		d.errorf(blk.DefRange, "GPU constraints on a CPU job", "The gpu block constrains GPUs, but %s = 0 asks for none: remove the block or ask for GPUs.", countAttr)
	}
	return g
}

// duration decodes a positive duration (or zero when zeroOK).
func (d *decoder) duration(path string, a *hcl.Attribute, dst *time.Duration, zeroOK bool) bool {
	var s string
	if !d.str(path, a, &s) {
		return false
	}
	dur, err := time.ParseDuration(s)
	switch {
	case err != nil:
		d.errorf(a.Expr.Range(), "Invalid duration", "%s %q is not a duration: use a number and a unit, e.g. \"90s\", \"5m\", \"1h\".", path, s)
	case dur < 0 || dur == 0 && !zeroOK:
		d.errorf(a.Expr.Range(), "Invalid duration", "%s must be positive, got %q.", path, s)
	default:
		*dst = dur
		return true
	}
	return false
}

// checkJobName reports a train or sweep (kind) name that is not its own
// safe encoding.
func (d *decoder) checkJobName(kind, name string, rng hcl.Range) {
	if err := safename.Validate(name); err != nil {
		d.errorf(rng, "Invalid job name",
			"The %s block's name %q %s. The name becomes the Nomad job ID and a directory under the checkpoint root, so it must be %s.",
			kind, name, err, safename.Allowed)
	} else if kind == "sweep" && len(name) > MaxSweepNameLen {
		d.errorf(rng, "Invalid job name",
			"The sweep's name is %d bytes; at most %d leave room for its jobs' IDs (<sweep>-controller, <sweep>-trial-NNN).",
			len(name), MaxSweepNameLen)
	}
}

// imagePull decodes image_pull { force timeout auth { … } }.
func (d *decoder) imagePull(b *hcl.Block) *ImagePull {
	d.attrs["image_pull"] = b.DefRange
	c := d.content(b, imagePullSchema)
	p := &ImagePull{}
	d.bool("image_pull.force", c.Attributes["force"], &p.Force)
	var timeout string
	if a := c.Attributes["timeout"]; d.str("image_pull.timeout", a, &timeout) {
		dur, err := time.ParseDuration(timeout)
		switch {
		case err != nil:
			d.errorf(a.Expr.Range(), "Invalid duration", "image_pull.timeout %q is not a duration: use a number and a unit, e.g. \"90s\", \"5m\", \"1h\".", timeout)
		case dur <= 0:
			d.errorf(a.Expr.Range(), "Invalid duration", "image_pull.timeout must be positive, got %q.", timeout)
		default:
			p.Timeout = dur
		}
	}
	if blk := d.singleBlock(c.Blocks, "auth"); blk != nil {
		d.attrs["image_pull.auth"] = blk.DefRange
		ac := d.content(blk, authSchema)
		p.Auth = &RegistryAuth{}
		d.str("image_pull.auth.username", ac.Attributes["username"], &p.Auth.Username)
		d.str("image_pull.auth.password", ac.Attributes["password"], &p.Auth.Password)
		d.str("image_pull.auth.server_address", ac.Attributes["server_address"], &p.Auth.ServerAddress)
	}
	return p
}

// EnvCheckpointEvery is the environment variable that carries
// checkpoint { every } to the training script.
const EnvCheckpointEvery = contract.EnvCheckpointEvery

func (d *decoder) artifact(b *hcl.Block, i int) Artifact {
	prefix := "artifact[" + strconv.Itoa(i) + "]."
	d.attrs[strings.TrimSuffix(prefix, ".")] = b.DefRange
	c := d.content(b, artifactSchema)
	var a Artifact
	if d.str(prefix+"source", c.Attributes["source"], &a.Source) && a.Source == "" {
		d.errorf(c.Attributes["source"].Expr.Range(), "Invalid artifact source", "source may not be empty.")
	}
	d.str(prefix+"destination", c.Attributes["destination"], &a.Destination)
	if d.strMap(prefix+"options", c.Attributes["options"], &a.Options) {
		for _, k := range sortedKeys(a.Options) {
			if !hclsyntax.ValidIdentifier(k) {
				d.errorf(c.Attributes["options"].Expr.Range(), "Invalid artifact option", "%q is not a go-getter option name (letters, digits, underscores, dashes).", k)
			}
		}
	}
	return a
}

// ParseMemory reads a size with a unit — "16 GiB", "16GiB", "16000 MB",
// "512 MiB" — and returns MiB, rounded up. The units are those of Nomad's
// device attributes: MiB, GiB, MB, GB (also KiB/TiB, kB/TB).
func ParseMemory(s string) (int, error) {
	trimmed := strings.TrimSpace(s)
	i := strings.IndexFunc(trimmed, func(r rune) bool { return !(r >= '0' && r <= '9' || r == '.') })
	if i <= 0 {
		if i == 0 || trimmed == "" {
			return 0, fmt.Errorf("%q is not a size: use a number and a unit, e.g. \"16 GiB\"", s)
		}
		return 0, fmt.Errorf("%q has no unit: use MiB, GiB, MB or GB, e.g. \"16 GiB\"", s)
	}
	num, unit := trimmed[:i], strings.TrimSpace(trimmed[i:])
	n, ok := new(big.Float).SetString(num)
	if !ok {
		return 0, fmt.Errorf("%q is not a size: use a number and a unit, e.g. \"16 GiB\"", s)
	}
	bytesPer := map[string]float64{
		"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
		"kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
	}
	per, ok := bytesPer[unit]
	if !ok {
		return 0, fmt.Errorf("unknown unit %q in %q: use MiB, GiB, MB or GB", unit, s)
	}
	mib, _ := new(big.Float).Quo(new(big.Float).Mul(n, big.NewFloat(per)), big.NewFloat(1<<20)).Float64()
	if mib <= 0 {
		return 0, fmt.Errorf("%q must be more than zero", s)
	}
	if mib > 1<<30 {
		return 0, fmt.Errorf("%q is too large", s)
	}
	out := int(mib)
	if float64(out) < mib {
		out++
	}
	return out, nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
