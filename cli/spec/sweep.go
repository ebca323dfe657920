package spec

import (
	"fmt"
	"math"
	"math/big"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"

	"github.com/gpujob/gpujob/internal/pylaunch"
	"github.com/gpujob/gpujob/internal/sweep/search"
	"github.com/gpujob/gpujob/internal/sweep/stopping"
)

// A sweep spec runs one train block many times, each trial with its own
// values of the declared params:
//
//	sweep "bert-lr" {
//	  train {
//	    command = "/usr/bin/python3"
//	    args    = ["bert_finetune.py", "--lr", param.lr, "--layers=${param.layers}"]
//	  }
//	  param "lr"     { loguniform = [1e-5, 1e-2] }
//	  param "layers" { choice = [2, 4] }
//	  objective {
//	    metric = "accuracy"
//	  }
//	  max_trials = 24
//	}
//
// param.NAME may appear only in the train block's command, args and env
// values. While the sweep is decoded each reference evaluates to a
// placeholder string; Sweep.Train replaces the placeholders with a trial's
// values.

// Defaults of the optional sweep fields.
const (
	DefaultParallel        = 1
	DefaultMaxFailedTrials = 3
	DefaultAlgorithm       = "random"
	DefaultASHAGrace       = 1
	DefaultASHAReduction   = 3
	DefaultMedianMinTrials = 5
	DefaultMedianInterval  = 1
)

// MaxTrials bounds max_trials (also through gpujob sweep extend): the
// controller's state holds every trial (about 450 bytes each) in one Consul
// value, written in a transaction whose request Consul caps at 512 KiB.
const MaxTrials = 500

// MaxSweepNameLen bounds a sweep's name so that its jobs' IDs,
// "<sweep>-controller" and "<sweep>-trial-NNN", stay valid job names.
const MaxSweepNameLen = 117

// The search algorithms of search { algorithm }.
const (
	AlgorithmGrid   = "grid"
	AlgorithmRandom = "random"
	AlgorithmTPE    = "tpe"
)

// The early stopping rules, early_stop "<rule>".
const (
	RuleASHA   = "asha"
	RuleMedian = "median"
)

// Sweep is a decoded `sweep` block with defaults applied and variables
// resolved.
type Sweep struct {
	Name string
	// Template is the train block. Its Command, Args elements and Env values
	// may hold param placeholders (see Placeholder); every other field is
	// final. Template.Name is the sweep's name. Use Train for a trial's spec.
	Template *Train
	// Params is the search space, in the order of the param blocks.
	Params          search.Space
	Objective       Objective
	Search          Search
	EarlyStop       *EarlyStop // nil when the spec has no early_stop block
	MaxTrials       int        // >= 1; with grid search, at most the grid's size (its default)
	Parallel        int        // trials running at once, >= 1
	MaxFailedTrials int        // failed trials the sweep tolerates, >= 0
	Ranges          SweepRanges
}

// Objective is the metric a sweep optimises.
type Objective struct {
	Metric string
	Mode   stopping.Mode // max (default) or min
	// Goal, when set, ends the sweep once a trial reaches it.
	Goal *float64
}

// Search is the sampler that proposes the trials.
type Search struct {
	Algorithm string // grid, random (default) or tpe
	Seed      uint64
}

// EarlyStop is early_stop "<rule>" { … }: exactly one of ASHA and Median is
// set, as Rule says.
type EarlyStop struct {
	Rule   string // asha or median
	ASHA   *stopping.ASHA
	Median *stopping.Median
}

// SweepRanges locate a Sweep in its source.
type SweepRanges struct {
	// Block is the `sweep "<name>"` header; Name is its label.
	Block, Name hcl.Range
	// Params holds each param block's header, by param name.
	Params map[string]hcl.Range
	// Attrs holds the value range of every sweep attribute set in the spec
	// by its path: "max_trials", "objective.metric", "search.seed", ….
	Attrs map[string]hcl.Range
}

// Of returns the range of the attribute at path, or the block header when
// the spec does not set it.
func (r SweepRanges) Of(path string) hcl.Range {
	if rng, ok := r.Attrs[path]; ok {
		return rng
	}
	return r.Block
}

// Placeholder is the string a reference to param name evaluates to while a
// sweep is decoded, and which Sweep.Train replaces with a trial's value.
func Placeholder(name string) string { return placeholderOpen + name + placeholderClose }

const (
	placeholderOpen  = "\x00gpujob-param:"
	placeholderClose = "\x00"
)

var placeholderRE = regexp.MustCompile("\x00gpujob-param:([^\x00]*)\x00")

// References maps each template field that uses params to the names it
// uses, in order of appearance: "command", "args[2]", "env.LR".
func (s *Sweep) References() map[string][]string {
	out := map[string][]string{}
	add := func(field, v string) {
		for _, m := range placeholderRE.FindAllStringSubmatch(v, -1) {
			out[field] = append(out[field], m[1])
		}
	}
	add("command", s.Template.Command)
	for i, a := range s.Template.Args {
		add("args["+strconv.Itoa(i)+"]", a)
	}
	for k, v := range s.Template.Env {
		add("env."+k, v)
	}
	return out
}

// Train returns the train spec of the trial that runs with a: the template
// with every param placeholder replaced by its value's String(). a must be
// a point of s.Params.
func (s *Sweep) Train(a search.Assignment) (*Train, error) {
	if err := s.Params.Contains(a); err != nil {
		return nil, fmt.Errorf("sweep %q: %w", s.Name, err)
	}
	pairs := make([]string, 0, 2*len(a))
	for _, p := range s.Params {
		pairs = append(pairs, Placeholder(p.Name), a[p.Name].String())
	}
	// One pass: a value that happens to look like a placeholder stays as is.
	r := strings.NewReplacer(pairs...)
	t := *s.Template
	t.Command = r.Replace(t.Command)
	if t.Args != nil {
		t.Args = make([]string, len(s.Template.Args))
		for i, arg := range s.Template.Args {
			t.Args[i] = r.Replace(arg)
		}
	}
	if t.Env != nil {
		t.Env = make(map[string]string, len(s.Template.Env))
		for k, v := range s.Template.Env {
			t.Env[k] = r.Replace(v)
		}
	}
	// Checks of train spec's that a value can break.
	bad := func(field, v string) error {
		if strings.IndexByte(v, 0) >= 0 {
			return fmt.Errorf("sweep %q, trial %s: %s %q holds a NUL byte", s.Name, a, field, v)
		}
		return nil
	}
	if strings.TrimSpace(t.Command) == "" {
		return nil, fmt.Errorf("sweep %q, trial %s: command is empty", s.Name, a)
	}
	if err := bad("command", t.Command); err != nil {
		return nil, err
	}
	for i, arg := range t.Args {
		if err := bad("args["+strconv.Itoa(i)+"]", arg); err != nil {
			return nil, err
		}
	}
	for _, k := range sortedKeys(t.Env) {
		if err := bad("env."+k, t.Env[k]); err != nil {
			return nil, err
		}
	}
	if len(t.Preload) > 0 {
		if _, err := pylaunch.Parse(t.Command, t.Args); err != nil {
			return nil, fmt.Errorf("sweep %q, trial %s: preload: %w", s.Name, a, err)
		}
	}
	return &t, nil
}

var sweepSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "max_trials"},
		{Name: "parallel"},
		{Name: "max_failed_trials"},
	},
	Blocks: []hcl.BlockHeaderSchema{
		{Type: "train"},
		{Type: "param", LabelNames: []string{"name"}},
		{Type: "objective"},
		{Type: "search"},
		{Type: "early_stop", LabelNames: []string{"rule"}},
	},
}

var paramKinds = []search.Kind{search.KindUniform, search.KindLogUniform, search.KindIntUniform, search.KindChoice, search.KindGrid}

var paramSchema = func() *hcl.BodySchema {
	s := &hcl.BodySchema{}
	for _, k := range paramKinds {
		s.Attributes = append(s.Attributes, hcl.AttributeSchema{Name: string(k)})
	}
	return s
}()

var objectiveSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{{Name: "metric", Required: true}, {Name: "mode"}, {Name: "goal"}},
}

var searchSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{{Name: "algorithm"}, {Name: "seed"}},
}

var earlyStopSchemas = map[string]*hcl.BodySchema{
	RuleASHA:   {Attributes: []hcl.AttributeSchema{{Name: "grace_period"}, {Name: "reduction_factor"}}},
	RuleMedian: {Attributes: []hcl.AttributeSchema{{Name: "grace_period"}, {Name: "min_trials"}, {Name: "interval"}}},
}

// ParseSweepFile reads the sweep spec at path.
func ParseSweepFile(path string, o Options) (*Sweep, hcl.Diagnostics) {
	s, _, diags := LoadSweep(path, o)
	return s, diags
}

// ParseSweep reads a sweep spec from src; filename names it in diagnostics.
func ParseSweep(src []byte, filename string, o Options) (*Sweep, hcl.Diagnostics) {
	s, _, diags := LoadSweepSource(src, filename, o)
	return s, diags
}

// LoadSweep is ParseSweepFile that also returns every source it read; see Load.
func LoadSweep(path string, o Options) (*Sweep, map[string]*hcl.File, hcl.Diagnostics) {
	p, f, diags := parseSpecFile(path)
	return decodeSweepFile(p, f, diags, o)
}

// LoadSweepSource is ParseSweep that also returns the sources it read.
func LoadSweepSource(src []byte, filename string, o Options) (*Sweep, map[string]*hcl.File, hcl.Diagnostics) {
	p, f, diags := parseSpecSource(src, filename)
	return decodeSweepFile(p, f, diags, o)
}

func decodeSweepFile(p *hclparse.Parser, f *hcl.File, diags hcl.Diagnostics, o Options) (*Sweep, map[string]*hcl.File, hcl.Diagnostics) {
	sf, diags := readFile(p, f, diags, o, "sweep")
	if sf == nil {
		return nil, p.Files(), diags
	}
	s, d := decodeSweep(sf)
	for _, diag := range d {
		if diag.Summary == "Unknown variable" {
			diag.Detail += " A sweep spec knows only var.<name> and, in the train block's command, args and env, param.<name>; to pass a Nomad runtime variable through to the task, escape it: $${NOMAD_ALLOC_INDEX}."
		}
	}
	diags = append(diags, d...)
	if diags.HasErrors() {
		return nil, p.Files(), diags
	}
	return s, p.Files(), diags
}

func decodeSweep(sf *specFile) (*Sweep, hcl.Diagnostics) {
	b := sf.block
	ctx := &hcl.EvalContext{
		Variables: map[string]cty.Value{"var": sf.varObj},
		Functions: functions,
	}
	d := &decoder{ctx: ctx, attrs: map[string]hcl.Range{}}
	s := &Sweep{
		Name:            b.Labels[0],
		Parallel:        DefaultParallel,
		MaxFailedTrials: DefaultMaxFailedTrials,
		Objective:       Objective{Mode: stopping.Max},
		Search:          Search{Algorithm: DefaultAlgorithm},
		Ranges:          SweepRanges{Block: b.DefRange, Name: b.LabelRanges[0], Params: map[string]hcl.Range{}, Attrs: d.attrs},
	}
	c := d.content(b, sweepSchema)
	at := c.Attributes

	// Params first: the train block refers to them.
	for _, blk := range c.Blocks {
		if blk.Type != "param" {
			continue
		}
		name := blk.Labels[0]
		if prev, ok := s.Ranges.Params[name]; ok {
			d.errorf(blk.DefRange, "Duplicate param", "Param %q is already declared at %s.", name, prev)
			continue
		}
		s.Ranges.Params[name] = blk.DefRange
		if !hclsyntax.ValidIdentifier(name) {
			d.errorf(blk.LabelRanges[0], "Invalid param name", "%q is not a valid name: use letters, digits, underscores and dashes, starting with a letter (it is used as param.%s).", name, name)
			continue
		}
		if p, ok := d.param(blk, sf.file); ok {
			s.Params = append(s.Params, p)
		}
	}
	if len(s.Ranges.Params) == 0 {
		d.errorf(b.DefRange, "Missing param block", `A sweep needs at least one param "<name>" { … } block, e.g. param "lr" { loguniform = [1e-5, 1e-2] }.`)
	}

	// References to param: only in the train block's command, args and
	// env, only to declared params. Errors the evaluation then reports at
	// the same places are dropped: they say the same less clearly.
	misuse := d.checkParamRefs(c, s.Ranges.Params)

	placeholders := make(map[string]cty.Value, len(s.Ranges.Params))
	for name := range s.Ranges.Params {
		placeholders[name] = cty.StringVal(Placeholder(name))
	}
	trainCtx := &hcl.EvalContext{
		Variables: map[string]cty.Value{"var": sf.varObj, "param": cty.ObjectVal(placeholders)},
		Functions: functions,
	}
	if blk := d.singleBlock(c.Blocks, "train"); blk == nil {
		d.checkJobName("sweep", s.Name, b.LabelRanges[0])
		d.errorf(b.DefRange, "Missing train block", "A sweep needs a train { … } block: the job each trial runs, with every field of a train spec.")
	} else {
		t, td := decodeTrainBody(blk, s.Name, b.LabelRanges[0], "sweep", trainCtx)
		for _, diag := range td {
			if diag.Summary == "Invalid env" && unplaceholder(diag.Detail) != diag.Detail {
				diag.Summary, diag.Detail = "Invalid param reference", "param can only be used in env values, not in names."
			}
			diag.Detail = unplaceholder(diag.Detail)
			d.diags = append(d.diags, diag)
		}
		if !td.HasErrors() {
			d.checkPlaceholders(t)
			d.checkRefsKept(blk, t)
		}
		s.Template = t
	}

	if blk := d.singleBlock(c.Blocks, "objective"); blk == nil {
		d.errorf(b.DefRange, "Missing objective block", `A sweep needs an objective { metric = "…" } block: the metric its trials report and the sweep optimises.`)
	} else {
		d.attrs["objective"] = blk.DefRange
		oc := d.content(blk, objectiveSchema)
		if d.str("objective.metric", oc.Attributes["metric"], &s.Objective.Metric) && strings.TrimSpace(s.Objective.Metric) == "" {
			d.errorf(oc.Attributes["metric"].Expr.Range(), "Invalid objective.metric", "metric may not be empty.")
		}
		var mode string
		if d.str("objective.mode", oc.Attributes["mode"], &mode) {
			switch stopping.Mode(mode) {
			case stopping.Max, stopping.Min:
				s.Objective.Mode = stopping.Mode(mode)
			default:
				d.errorf(oc.Attributes["mode"].Expr.Range(), "Invalid objective.mode", `mode is "max" (larger is better, the default) or "min", got %q.`, mode)
			}
		}
		if a := oc.Attributes["goal"]; a != nil {
			if v, ok := d.value("objective.goal", a, cty.Number); ok {
				g, _ := v.AsBigFloat().Float64()
				if math.IsInf(g, 0) {
					d.errorf(a.Expr.Range(), "Invalid objective.goal", "goal %s is out of range.", numberText(v.AsBigFloat()))
				} else {
					s.Objective.Goal = &g
				}
			}
		}
	}

	if blk := d.singleBlock(c.Blocks, "search"); blk != nil {
		d.attrs["search"] = blk.DefRange
		sc := d.content(blk, searchSchema)
		var alg string
		if d.str("search.algorithm", sc.Attributes["algorithm"], &alg) {
			switch alg {
			case AlgorithmGrid, AlgorithmRandom, AlgorithmTPE:
				s.Search.Algorithm = alg
			default:
				d.errorf(sc.Attributes["algorithm"].Expr.Range(), "Invalid search.algorithm", `algorithm is "grid", "random" (the default) or "tpe", got %q.`, alg)
			}
		}
		var seed int
		if d.int("search.seed", sc.Attributes["seed"], &seed) {
			if seed < 0 {
				d.errorf(sc.Attributes["seed"].Expr.Range(), "Invalid search.seed", "seed must be 0 or more, got %d.", seed)
			} else {
				s.Search.Seed = uint64(seed)
			}
		}
	}

	var esBlock *hcl.Block
	for _, blk := range c.Blocks {
		if blk.Type != "early_stop" {
			continue
		}
		if esBlock != nil {
			d.errorf(blk.DefRange, "Duplicate early_stop block", "Only one early_stop block is allowed; the first is at %s.", esBlock.DefRange)
			continue
		}
		esBlock = blk
		s.EarlyStop = d.earlyStop(blk)
	}

	n := len(d.diags)
	if d.int("max_trials", at["max_trials"], &s.MaxTrials) && s.MaxTrials < 1 {
		d.errorf(at["max_trials"].Expr.Range(), "Invalid max_trials", "max_trials must be at least 1, got %d.", s.MaxTrials)
	} else if s.MaxTrials > MaxTrials {
		d.errorf(at["max_trials"].Expr.Range(), "Invalid max_trials",
			"max_trials must be at most %d, got %d: the controller keeps every trial's record in one Consul value. Run several sweeps.", MaxTrials, s.MaxTrials)
	}
	maxTrialsBad := len(d.diags) > n
	if d.int("parallel", at["parallel"], &s.Parallel) && s.Parallel < 1 {
		d.errorf(at["parallel"].Expr.Range(), "Invalid parallel", "parallel must be at least 1, got %d.", s.Parallel)
	}
	if d.int("max_failed_trials", at["max_failed_trials"], &s.MaxFailedTrials) && s.MaxFailedTrials < 0 {
		d.errorf(at["max_failed_trials"].Expr.Range(), "Invalid max_failed_trials", "max_failed_trials must be 0 or more, got %d.", s.MaxFailedTrials)
	}

	// The space as a whole, and what the algorithm makes of it. Each param
	// is valid on its own already; only a full space is judged.
	if len(s.Params) == len(s.Ranges.Params) && len(s.Params) > 0 {
		if s.Search.Algorithm == AlgorithmGrid {
			g, err := search.NewGrid(s.Params)
			switch {
			case err != nil:
				d.errorf(s.Ranges.Of("search.algorithm"), "Invalid grid search", "%s.", err)
			case at["max_trials"] == nil:
				s.MaxTrials = g.Size()
			case !maxTrialsBad && s.MaxTrials > g.Size():
				d.errorf(at["max_trials"].Expr.Range(), "Invalid max_trials", "max_trials is %d, but the grid has only %d combinations; leave max_trials out to run them all.", s.MaxTrials, g.Size())
			}
		} else if err := s.Params.Validate(); err != nil {
			d.errorf(b.DefRange, "Invalid search space", "%s.", err)
		}
	}
	if at["max_trials"] == nil && s.Search.Algorithm != AlgorithmGrid {
		d.errorf(b.DefRange, "Missing required argument", "The sweep needs max_trials, the number of trials to run (only a grid search defaults to the grid's size).")
	}
	return s, dropShadowed(d.diags, misuse)
}

// dropShadowed drops the diagnostics that repeat, less clearly, a param
// reference error of misuse: an evaluation error at the same place.
func dropShadowed(diags hcl.Diagnostics, misuse map[*hcl.Diagnostic]hcl.Range) hcl.Diagnostics {
	if len(misuse) == 0 {
		return diags
	}
	out := diags[:0]
	for _, diag := range diags {
		if _, own := misuse[diag]; !own && diag.Subject != nil && overlapsAny(*diag.Subject, misuse) {
			continue
		}
		out = append(out, diag)
	}
	return out
}

// param decodes param "<name>" { <kind> = … }.
func (d *decoder) param(b *hcl.Block, f *hcl.File) (search.Param, bool) {
	name := b.Labels[0]
	c := d.content(b, paramSchema)
	var kind search.Kind
	var a *hcl.Attribute
	for _, k := range paramKinds {
		ka := c.Attributes[string(k)]
		if ka == nil {
			continue
		}
		if a != nil {
			d.errorf(ka.NameRange, "Conflicting param kinds", "Param %q is already %s (at %s); a param has exactly one kind.", name, kind, a.NameRange)
			return search.Param{}, false
		}
		kind, a = k, ka
	}
	if a == nil {
		d.errorf(b.DefRange, "Missing param kind", "Param %q needs one of uniform = [lo, hi], loguniform = [lo, hi], int_uniform = [lo, hi], choice = [values…] or grid = [values…].", name)
		return search.Param{}, false
	}
	path := "param." + name + "." + string(kind)
	vals, ok := d.paramValues(path, a, f)
	if !ok {
		return search.Param{}, false
	}
	var p search.Param
	switch kind {
	case search.KindUniform, search.KindLogUniform, search.KindIntUniform:
		if len(vals) != 2 {
			d.errorf(a.Expr.Range(), "Invalid param "+name, "%s takes two bounds, [lo, hi]; got %d values.", kind, len(vals))
			return search.Param{}, false
		}
		var bounds [2]float64
		for i, v := range vals {
			f, isNum := v.Float64()
			if !isNum {
				d.errorf(a.Expr.Range(), "Invalid param "+name, "%s bounds are numbers; got %q.", kind, v.String())
				return search.Param{}, false
			}
			bounds[i] = f
		}
		switch kind {
		case search.KindUniform:
			p = search.Uniform(name, bounds[0], bounds[1])
		case search.KindLogUniform:
			p = search.LogUniform(name, bounds[0], bounds[1])
		default:
			lo, loInt := vals[0].Int64()
			hi, hiInt := vals[1].Int64()
			if !loInt || !hiInt {
				d.errorf(a.Expr.Range(), "Invalid param "+name, "int_uniform bounds are whole numbers written without a decimal point, got [%s, %s].", vals[0], vals[1])
				return search.Param{}, false
			}
			p = search.IntUniform(name, lo, hi)
		}
	case search.KindChoice:
		p = search.Choice(name, vals...)
	default:
		p = search.GridParam(name, vals...)
	}
	if err := p.Validate(); err != nil {
		d.errorf(a.Expr.Range(), "Invalid param "+name, "%s.", err)
		return search.Param{}, false
	}
	return p, true
}

// decimalNumber matches the source of a number literal with a fraction or
// an exponent: such a number is a float even when whole (2.0, 1e3).
var decimalNumber = regexp.MustCompile(`[0-9]\.[0-9]|[0-9][eE]`)

// paramValues evaluates a's list of numbers and strings. A whole number is
// an int Value unless its source is written with a decimal point or an
// exponent (search tells int 2 and float 2 apart).
func (d *decoder) paramValues(path string, a *hcl.Attribute, f *hcl.File) ([]search.Value, bool) {
	d.attrs[path] = a.Expr.Range()
	elems, diags := hcl.ExprList(a.Expr)
	if diags.HasErrors() {
		// Not a literal list (var.values, concat(…)): evaluate it whole.
		v, ok := d.value(path, a, cty.DynamicPseudoType)
		if !ok {
			return nil, false
		}
		if ty := v.Type(); !ty.IsTupleType() && !ty.IsListType() && !ty.IsSetType() {
			d.errorf(a.Expr.Range(), "Invalid param value", "%s takes a list, e.g. [1, 2]; got a %s.", a.Name, ty.FriendlyName())
			return nil, false
		}
		var out []search.Value
		for it := v.ElementIterator(); it.Next(); {
			_, e := it.Element()
			pv, ok := d.paramValue(a, e, a.Expr.Range(), "")
			if !ok {
				return nil, false
			}
			out = append(out, pv)
		}
		return out, true
	}
	out := make([]search.Value, 0, len(elems))
	for _, e := range elems {
		v, diags := e.Value(d.ctx)
		d.diags = append(d.diags, diags...)
		if diags.HasErrors() || !v.IsWhollyKnown() {
			return nil, false
		}
		src := ""
		if rng := e.Range(); f != nil && rng.Filename == a.Expr.Range().Filename && rng.End.Byte <= len(f.Bytes) {
			src = string(rng.SliceBytes(f.Bytes))
		}
		pv, ok := d.paramValue(a, v, e.Range(), src)
		if !ok {
			return nil, false
		}
		out = append(out, pv)
	}
	return out, true
}

func (d *decoder) paramValue(a *hcl.Attribute, v cty.Value, rng hcl.Range, src string) (search.Value, bool) {
	if v.IsNull() {
		d.errorf(rng, "Invalid param value", "%s values may not be null.", a.Name)
		return search.Value{}, false
	}
	switch v.Type() {
	case cty.String:
		return search.StringValue(v.AsString()), true
	case cty.Number:
		bf := v.AsBigFloat()
		if bf.IsInt() && !decimalNumber.MatchString(src) {
			if i, acc := bf.Int64(); acc == big.Exact {
				return search.IntValue(i), true
			}
		}
		f, _ := bf.Float64()
		if math.IsInf(f, 0) {
			d.errorf(rng, "Value out of range", "%s: %s is too large.", a.Name, numberText(bf))
			return search.Value{}, false
		}
		return search.FloatValue(f), true
	}
	d.errorf(rng, "Invalid param value", "%s values are numbers or strings, got a %s.", a.Name, v.Type().FriendlyName())
	return search.Value{}, false
}

// earlyStop decodes early_stop "asha" | "median" { … }.
func (d *decoder) earlyStop(b *hcl.Block) *EarlyStop {
	rule := b.Labels[0]
	schema, ok := earlyStopSchemas[rule]
	if !ok {
		d.errorf(b.LabelRanges[0], "Invalid early_stop rule", `early_stop is "asha" or "median", got %q.`, rule)
		return nil
	}
	d.attrs["early_stop"] = b.DefRange
	c := d.content(b, schema)
	at := c.Attributes
	es := &EarlyStop{Rule: rule}
	var err error
	if rule == RuleASHA {
		es.ASHA = &stopping.ASHA{GracePeriod: DefaultASHAGrace, ReductionFactor: DefaultASHAReduction}
		d.int("early_stop.grace_period", at["grace_period"], &es.ASHA.GracePeriod)
		d.int("early_stop.reduction_factor", at["reduction_factor"], &es.ASHA.ReductionFactor)
		// Zero would mean the default inside stopping: refuse it here.
		switch {
		case es.ASHA.GracePeriod < 1:
			err = fmt.Errorf("grace_period must be at least 1, got %d", es.ASHA.GracePeriod)
		case es.ASHA.ReductionFactor < 2:
			err = fmt.Errorf("reduction_factor must be at least 2, got %d", es.ASHA.ReductionFactor)
		default:
			err = es.ASHA.Validate()
		}
	} else {
		es.Median = &stopping.Median{MinTrials: DefaultMedianMinTrials, Interval: DefaultMedianInterval}
		d.int("early_stop.grace_period", at["grace_period"], &es.Median.GracePeriod)
		d.int("early_stop.min_trials", at["min_trials"], &es.Median.MinTrials)
		d.int("early_stop.interval", at["interval"], &es.Median.Interval)
		if es.Median.Interval < 1 {
			err = fmt.Errorf("interval must be at least 1, got %d", es.Median.Interval)
		} else {
			err = es.Median.Validate()
		}
	}
	if err != nil {
		msg := strings.TrimPrefix(err.Error(), "early_stop: ")
		rng := b.DefRange
		for _, name := range []string{"grace_period", "reduction_factor", "min_trials", "interval"} {
			if a := at[name]; a != nil && strings.HasPrefix(msg, name+" ") {
				rng = a.Expr.Range()
			}
		}
		d.errorf(rng, "Invalid early_stop", "early_stop %q: %s.", rule, msg)
	}
	return es
}

// paramFields are the train attributes whose strings may use param.NAME.
var paramFields = map[string]bool{"command": true, "args": true, "env": true}

// checkParamRefs reports every reference to param outside the train
// block's command, args and env, and every reference to an undeclared
// param. It returns the diagnostics it added, with their ranges.
func (d *decoder) checkParamRefs(c *hcl.BodyContent, declared map[string]hcl.Range) map[*hcl.Diagnostic]hcl.Range {
	bad := map[*hcl.Diagnostic]hcl.Range{}
	check := func(a *hcl.Attribute, allowed bool) {
		for _, tr := range a.Expr.Variables() {
			if tr.RootName() != "param" {
				continue
			}
			rng := tr.SourceRange()
			name, ok := "", len(tr) >= 2
			if ok {
				switch step := tr[1].(type) {
				case hcl.TraverseAttr:
					name = step.Name
				case hcl.TraverseIndex:
					if step.Key.Type() == cty.String && step.Key.IsKnown() && !step.Key.IsNull() {
						name = step.Key.AsString()
					} else {
						ok = false
					}
				default:
					ok = false
				}
			}
			switch {
			case !ok:
				d.errorf(rng, "Invalid param reference", "Use one param at a time, param.<name>.")
			case !allowed:
				d.errorf(rng, "Invalid param reference", "param.%s can only be used in command, args and env (its values) of the train block.", name)
			case !hasKey(declared, name):
				d.errorf(rng, "Undeclared param", "param.%s: the sweep declares no param %q; declare it with a param %q { … } block%s.", name, name, name, didYouMeanParam(name, declared))
			default:
				continue
			}
			bad[d.diags[len(d.diags)-1]] = rng
		}
	}
	for _, a := range sortedAttrs(c.Attributes) {
		check(a, false)
	}
	for _, blk := range c.Blocks {
		if blk.Type != "train" {
			// Flat blocks: JustAttributes reads them in both syntaxes.
			attrs, _ := blk.Body.JustAttributes()
			for _, a := range sortedAttrs(attrs) {
				check(a, false)
			}
			continue
		}
		if body, ok := blk.Body.(*hclsyntax.Body); ok {
			var walk func(b *hclsyntax.Body, top bool)
			walk = func(b *hclsyntax.Body, top bool) {
				attrs := make(hcl.Attributes, len(b.Attributes))
				for n, a := range b.Attributes {
					attrs[n] = a.AsHCLAttribute()
				}
				for _, a := range sortedAttrs(attrs) {
					check(a, top && paramFields[a.Name])
				}
				for _, nb := range b.Blocks {
					walk(nb.Body, false)
				}
			}
			walk(body, true)
			continue
		}
		// JSON: nested blocks are attributes whose object values the
		// traversals are found in.
		attrs, _ := blk.Body.JustAttributes()
		for _, a := range sortedAttrs(attrs) {
			check(a, paramFields[a.Name])
		}
	}
	return bad
}

// checkRefsKept reports a field that refers to a param whose value then
// holds no placeholder of it: the param went into a condition, a
// comparison or a function whose result does not carry its text, so every
// trial would run what the placeholder made of it.
func (d *decoder) checkRefsKept(blk *hcl.Block, t *Train) {
	body, ok := blk.Body.(*hclsyntax.Body)
	if !ok {
		return
	}
	env := make([]string, 0, len(t.Env))
	for _, k := range sortedKeys(t.Env) {
		env = append(env, t.Env[k])
	}
	values := map[string]string{"command": t.Command, "args": strings.Join(t.Args, "\n"), "env": strings.Join(env, "\n")}
	for _, field := range []string{"command", "args", "env"} {
		a := body.Attributes[field]
		if a == nil {
			continue
		}
		for _, tr := range a.Expr.Variables() {
			if tr.RootName() != "param" || len(tr) < 2 {
				continue
			}
			step, ok := tr[1].(hcl.TraverseAttr)
			if !ok || strings.Contains(values[field], Placeholder(step.Name)) {
				continue
			}
			d.errorf(tr.SourceRange(), "Invalid param reference",
				"%s uses param.%s in a way whose result does not carry its value (a condition, a comparison or a function): every trial would run the same. Use param.%s as is, or in a string template like \"--lr=${param.lr}\".",
				field, step.Name, step.Name)
		}
	}
}

// checkPlaceholders reports placeholders where no param reference may put
// them (an env name) and mangled ones (upper(param.x)), which Train could
// not replace.
func (d *decoder) checkPlaceholders(t *Train) {
	check := func(field, v string) {
		if strings.IndexByte(placeholderRE.ReplaceAllString(v, ""), 0) >= 0 {
			d.errorf(t.Ranges.Of(field), "Invalid param reference",
				"%s uses a param in a way a trial cannot fill in (a function that changes its text, or a NUL byte): use param.<name> as is, or in a string template like \"--lr=${param.lr}\".", field)
		}
	}
	check("command", t.Command)
	for _, a := range t.Args {
		check("args", a)
	}
	for _, k := range sortedKeys(t.Env) {
		if strings.IndexByte(k, 0) >= 0 {
			d.errorf(t.Ranges.Of("env"), "Invalid param reference", "param can only be used in env values, not in names: %s.", unplaceholder(strconv.Quote(k)))
			continue
		}
		check("env", t.Env[k])
	}
}

// unplaceholder writes placeholders in an error message, raw or quoted, as
// the references they stand for.
func unplaceholder(s string) string {
	s = placeholderRE.ReplaceAllString(s, "$${param.$1}")
	return quotedPlaceholderRE.ReplaceAllString(s, "$${param.$1}")
}

var quotedPlaceholderRE = regexp.MustCompile(`\\x00gpujob-param:(.*?)\\x00`)

func overlapsAny(r hcl.Range, ranges map[*hcl.Diagnostic]hcl.Range) bool {
	for _, o := range ranges {
		if r.Overlaps(o) {
			return true
		}
	}
	return false
}

func hasKey(m map[string]hcl.Range, k string) bool {
	_, ok := m[k]
	return ok
}

func didYouMeanParam(name string, declared map[string]hcl.Range) string {
	vars := make(map[string]*variable, len(declared))
	for n := range declared {
		vars[n] = nil
	}
	return didYouMean(name, vars)
}

func sortedAttrs(m hcl.Attributes) []*hcl.Attribute {
	out := make([]*hcl.Attribute, 0, len(m))
	for _, a := range m {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool {
		ri, rj := out[i].Range, out[j].Range
		if ri.Filename != rj.Filename {
			return ri.Filename < rj.Filename
		}
		return ri.Start.Byte < rj.Start.Byte
	})
	return out
}
