// Package queuefile reads queue files, the operators' description of the
// cluster's queues that `gpujob queue apply` stores in Consul:
//
//	queue "team-a" {
//	  gpus     = 8      # quota; 0 or absent: no quota
//	  weight   = 2      # fair-share weight; default 1
//	  borrow   = true   # may use idle quota of its cohort; default false
//	  priority = 60     # of its jobs that set none; default 50
//	  cohort   = "research"
//	}
//
// A file may declare no queue at all: then the cluster has the one default
// queue, policy.DefaultQueue ("default"), with no quota and weight 1, that
// every job is in. Once a file declares queues, those are all the queues:
// a job naming no queue is in the queue named "default", which the file
// must then declare for such jobs to be accepted.
//
// Every error is an hcl.Diagnostic whose Subject points at the offending
// file:line:col, like the spec parser's (cli/spec.Format prints both).
// Validate applies the same rules to a configuration that did not come
// from a file (one read back from Consul), so a stored value is never
// trusted more than a file.
package queuefile

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/big"
	"os"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"

	"github.com/gpujob/gpujob/internal/queue/policy"
)

// Defaults of a queue block's optional attributes.
const (
	DefaultWeight   = 1.0
	DefaultPriority = policy.DefaultPriority
)

// Bounds of a queue block's values.
const (
	// MaxQueues bounds the queues of one file: the configuration is one
	// Consul value (512 KiB at most), about 150 bytes a queue.
	MaxQueues = 1000
	// MaxGPUs bounds a quota: far beyond any cluster, small enough that
	// sums of quotas never overflow.
	MaxGPUs = 1 << 20
	// MaxWeight bounds a weight, so weighted shares stay well-conditioned.
	MaxWeight = 1e6
	// MinPriority and MaxPriority are a spec's (and Nomad's) job priority
	// range.
	MinPriority = 1
	MaxPriority = 100
	// MaxNameLen bounds queue and cohort names.
	MaxNameLen = 63
)

// validName is a queue's or cohort's name: it is a job's meta value, a
// Prometheus label and a Consul key segment, so nothing that needs
// escaping in any of them.
var validName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]*$`)

// CheckText refuses text the queue's records may not hold: more than max
// bytes, invalid UTF-8, or a control character (a terminal escape in what
// `gpujob queue status` prints). The configuration and the queued-job
// records share it.
func CheckText(s string, max int) error {
	switch {
	case len(s) > max:
		return fmt.Errorf("%d bytes; at most %d", len(s), max)
	case !utf8.ValidString(s):
		return errors.New("not UTF-8")
	case strings.IndexFunc(s, unicode.IsControl) >= 0:
		return fmt.Errorf("%q holds a control character", Clip(s))
	}
	return nil
}

// Clip shortens s for an error message that quotes it, cutting at a rune
// boundary.
func Clip(s string) string {
	if len(s) > 80 {
		return strings.ToValidUTF8(s[:80], "") + "…"
	}
	return s
}

// CheckName reports a name that is not a valid queue name.
func CheckName(name string) error { return checkName("queue", name) }

// checkName is CheckName of a queue's or a cohort's name (kind).
func checkName(kind, name string) error {
	if len(name) > MaxNameLen || !validName.MatchString(name) {
		return fmt.Errorf("%q is not a %s name: 1 to %d letters, digits, '-' and '_', starting with a letter or digit", name, kind, MaxNameLen)
	}
	return nil
}

// File is a parsed queue file.
type File struct {
	// Config holds the queues in the file's order, defaults applied.
	Config policy.Config
	// SHA256 is the hex SHA-256 of the file's bytes.
	SHA256 string
	// Blocks locates each queue's block header, by queue name.
	Blocks map[string]hcl.Range
}

var fileSchema = &hcl.BodySchema{
	Blocks: []hcl.BlockHeaderSchema{{Type: "queue", LabelNames: []string{"name"}}},
}

var queueSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "gpus"},
		{Name: "weight"},
		{Name: "borrow"},
		{Name: "priority"},
		{Name: "cohort"},
	},
}

// ParseFile reads the queue file at path. It returns the sources it read,
// for source excerpts in error messages (cli/spec.Format).
func ParseFile(path string) (*File, map[string]*hcl.File, hcl.Diagnostics) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Cannot read the queue file",
			Detail: err.Error()}}
	}
	return Parse(src, path)
}

// Parse reads a queue file from src; filename names it in diagnostics.
func Parse(src []byte, filename string) (*File, map[string]*hcl.File, hcl.Diagnostics) {
	p := hclparse.NewParser()
	f, diags := p.ParseHCL(src, filename)
	if diags.HasErrors() {
		return nil, p.Files(), diags
	}
	if d := checkNumbers(src, filename); d.HasErrors() {
		return nil, p.Files(), d
	}
	content, diags := f.Body.Content(fileSchema)
	sum := sha256.Sum256(src)
	out := &File{SHA256: hex.EncodeToString(sum[:]), Blocks: map[string]hcl.Range{}}
	for _, b := range content.Blocks {
		q, d := decodeQueue(b)
		diags = append(diags, d...)
		if prev, ok := out.Blocks[q.Name]; ok {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Duplicate queue",
				Detail:  fmt.Sprintf("Queue %q is already declared at %s.", q.Name, prev),
				Subject: b.LabelRanges[0].Ptr()})
			continue
		}
		out.Blocks[q.Name] = b.DefRange
		out.Config.Queues = append(out.Config.Queues, q)
		if len(out.Config.Queues) == MaxQueues+1 {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Too many queues",
				Detail:  fmt.Sprintf("A queue file declares at most %d queues.", MaxQueues),
				Subject: b.DefRange.Ptr()})
		}
	}
	if diags.HasErrors() {
		return nil, p.Files(), diags
	}
	// The policy's own check, which the rules above make redundant; a
	// rule it gains is still enforced, at the file's start.
	if err := out.Config.Validate(); err != nil {
		rng := f.Body.MissingItemRange()
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Invalid queue configuration",
			Detail: err.Error() + ".", Subject: &rng})
		return nil, p.Files(), diags
	}
	return out, p.Files(), diags
}

// decodeQueue decodes one queue block, reporting each bad value at its
// attribute (or the block's label, for the name).
func decodeQueue(b *hcl.Block) (policy.QueueConfig, hcl.Diagnostics) {
	q := policy.QueueConfig{Name: b.Labels[0], Weight: DefaultWeight, Priority: DefaultPriority}
	// An unknown attribute is reported with the bad values of the known
	// ones, not instead of them.
	c, structural := b.Body.Content(queueSchema)
	q, diags := decodeValues(b, c.Attributes, q)
	return q, append(structural, diags...)
}

// decodeValues decodes and checks a queue block's attributes into q.
func decodeValues(b *hcl.Block, at hcl.Attributes, q policy.QueueConfig) (policy.QueueConfig, hcl.Diagnostics) {
	d := &decoder{}
	d.int(at["gpus"], &q.GPUs)
	d.number(at["weight"], &q.Weight)
	d.bool(at["borrow"], &q.Borrow)
	d.int(at["priority"], &q.Priority)
	d.str(at["cohort"], &q.Cohort)
	if d.diags.HasErrors() {
		return q, d.diags
	}
	for _, p := range checkQueue(q) {
		rng := b.DefRange
		switch a := at[p.field]; {
		case p.field == "name":
			rng = b.LabelRanges[0]
		case a != nil:
			rng = a.Expr.Range()
		}
		d.diags = append(d.diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Invalid " + p.field,
			Detail: p.msg + ".", Subject: rng.Ptr()})
	}
	if d.diags.HasErrors() {
		return q, d.diags
	}
	// The policy's check of this one queue, at its block.
	if err := (policy.Config{Queues: []policy.QueueConfig{q}}).Validate(); err != nil {
		d.diags = append(d.diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Invalid queue",
			Detail: err.Error() + ".", Subject: b.DefRange.Ptr()})
	}
	return q, d.diags
}

// problem is one value that breaks a rule, by the attribute that holds it.
type problem struct{ field, msg string }

// checkQueue applies the rules of a queue's values (its name, quota,
// weight, priority and cohort), whatever the values came from.
func checkQueue(q policy.QueueConfig) []problem {
	var out []problem
	if err := CheckName(q.Name); err != nil {
		out = append(out, problem{"name", err.Error()})
	}
	if q.GPUs < 0 || q.GPUs > MaxGPUs {
		out = append(out, problem{"gpus", fmt.Sprintf("gpus = %d; want 0 (no quota) to %d", q.GPUs, MaxGPUs)})
	}
	if !(q.Weight > 0 && q.Weight <= MaxWeight) { // NaN fails too
		out = append(out, problem{"weight", fmt.Sprintf("weight = %g; want more than 0 and at most %g", q.Weight, float64(MaxWeight))})
	}
	if q.Priority < MinPriority || q.Priority > MaxPriority {
		out = append(out, problem{"priority", fmt.Sprintf("priority = %d; want %d to %d", q.Priority, MinPriority, MaxPriority)})
	}
	if q.Cohort != "" {
		if err := checkName("cohort", q.Cohort); err != nil {
			out = append(out, problem{"cohort", err.Error()})
		}
	}
	return out
}

// Validate applies a queue file's rules to cfg, which did not come from a
// file (one read back from Consul): every value in range, every name
// valid, no queue twice, and the policy's own check.
func Validate(cfg policy.Config) error {
	if len(cfg.Queues) > MaxQueues {
		return fmt.Errorf("%d queues; at most %d", len(cfg.Queues), MaxQueues)
	}
	seen := map[string]bool{}
	for _, q := range cfg.Queues {
		if ps := checkQueue(q); len(ps) > 0 {
			if ps[0].field == "name" {
				return fmt.Errorf("queue: %s", ps[0].msg)
			}
			return fmt.Errorf("queue %q: %s", q.Name, ps[0].msg)
		}
		if seen[q.Name] {
			return fmt.Errorf("queue %q is declared twice", q.Name)
		}
		seen[q.Name] = true
	}
	return cfg.Validate()
}

// decoder evaluates a queue block's attributes: literal values of exactly
// the type asked for (no conversion, no variables, no functions).
type decoder struct {
	diags hcl.Diagnostics
}

func (d *decoder) value(a *hcl.Attribute, want cty.Type, what string) (cty.Value, bool) {
	if a == nil {
		return cty.NilVal, false
	}
	v, diags := a.Expr.Value(nil)
	d.diags = append(d.diags, diags...)
	if diags.HasErrors() {
		return cty.NilVal, false
	}
	if v.IsNull() || !v.IsKnown() || !v.Type().Equals(want) {
		d.diags = append(d.diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Incorrect attribute value type",
			Detail:  fmt.Sprintf("Inappropriate value for attribute %q: %s is required.", a.Name, what),
			Subject: a.Expr.Range().Ptr()})
		return cty.NilVal, false
	}
	return v, true
}

func (d *decoder) int(a *hcl.Attribute, dst *int) {
	v, ok := d.value(a, cty.Number, "a whole number")
	if !ok {
		return
	}
	bf := v.AsBigFloat()
	const limit = 1 << 31
	switch {
	case !bf.IsInt():
		d.diags = append(d.diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Incorrect attribute value type",
			Detail:  fmt.Sprintf("Inappropriate value for attribute %q: a whole number is required, got %s.", a.Name, numberText(bf)),
			Subject: a.Expr.Range().Ptr()})
	case bf.Cmp(big.NewFloat(limit)) >= 0 || bf.Cmp(big.NewFloat(-limit)) <= 0:
		d.diags = append(d.diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Value out of range",
			Detail: fmt.Sprintf("Attribute %q: %s is too large.", a.Name, numberText(bf)), Subject: a.Expr.Range().Ptr()})
	default:
		i, _ := bf.Int64()
		*dst = int(i)
	}
}

func (d *decoder) number(a *hcl.Attribute, dst *float64) {
	if v, ok := d.value(a, cty.Number, "a number"); ok {
		*dst, _ = v.AsBigFloat().Float64()
	}
}

func (d *decoder) bool(a *hcl.Attribute, dst *bool) {
	if v, ok := d.value(a, cty.Bool, "true or false"); ok {
		*dst = v.True()
	}
}

func (d *decoder) str(a *hcl.Attribute, dst *string) {
	if v, ok := d.value(a, cty.String, "a string"); ok {
		*dst = v.AsString()
	}
}

// maxNumberExp bounds the binary exponent of a number literal (as the spec
// parser does): HCL keeps numbers as arbitrary-precision floats, and
// turning a huge one into decimal text takes time that grows with the
// square of its exponent.
const maxNumberExp = 1024

// checkNumbers refuses the number literals of src that are out of range.
func checkNumbers(src []byte, filename string) hcl.Diagnostics {
	toks, _ := hclsyntax.LexConfig(src, filename, hcl.InitialPos) // the parser reported lexing errors
	var diags hcl.Diagnostics
	for _, tok := range toks {
		if tok.Type != hclsyntax.TokenNumberLit {
			continue
		}
		f, _, err := big.ParseFloat(string(tok.Bytes), 10, 64, big.ToNearestEven)
		if err != nil || f.Sign() == 0 {
			continue
		}
		if exp := f.MantExp(nil); exp < -maxNumberExp || exp > maxNumberExp {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Number out of range",
				Detail:  "A number beyond ±1.8e308 or nearer zero than 1e-308; a queue file's numbers are counts and weights.",
				Subject: tok.Range.Ptr()})
		}
	}
	return diags
}

// numberText shows a number without converting all of a huge one to
// decimal.
func numberText(bf *big.Float) string {
	if f, _ := bf.Float64(); !math.IsInf(f, 0) && (f != 0 || bf.Sign() == 0) {
		return fmt.Sprintf("%g", f)
	}
	return fmt.Sprintf("a number of about 2^%d", bf.MantExp(nil))
}
