package spec

import (
	"fmt"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/ext/typeexpr"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
	"github.com/zclconf/go-cty/cty/function"
	"github.com/zclconf/go-cty/cty/function/stdlib"
)

var variableSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "type"},
		{Name: "default"},
		{Name: "description"},
	},
}

// variable is a declared `variable "<name>"` block and the value it ends
// up with.
type variable struct {
	name     string
	typ      cty.Type // cty.DynamicPseudoType when the block has no type
	typed    bool
	defRange hcl.Range
	value    cty.Value
	hasValue bool // a default or a value set value
}

// decodeVariable reads one variable block.
func decodeVariable(b *hcl.Block) (*variable, hcl.Diagnostics) {
	v := &variable{name: b.Labels[0], typ: cty.DynamicPseudoType, defRange: b.DefRange}
	var diags hcl.Diagnostics
	if !hclsyntax.ValidIdentifier(v.name) {
		diags = append(diags, &hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  "Invalid variable name",
			Detail:   fmt.Sprintf("%q is not a valid name: use letters, digits, underscores and dashes, starting with a letter.", v.name),
			Subject:  b.LabelRanges[0].Ptr(),
		})
	}
	content, d := b.Body.Content(variableSchema)
	diags = append(diags, d...)
	if a, ok := content.Attributes["type"]; ok {
		ty, d := typeexpr.TypeConstraint(a.Expr)
		diags = append(diags, d...)
		if !d.HasErrors() {
			v.typ, v.typed = ty, true
		}
	}
	if a, ok := content.Attributes["description"]; ok {
		val, d := a.Expr.Value(nil)
		diags = append(diags, d...)
		if !d.HasErrors() {
			if _, err := convert.Convert(val, cty.String); err != nil {
				diags = append(diags, typeError("description", a.Expr.Range(), err))
			}
		}
	}
	if a, ok := content.Attributes["default"]; ok {
		val, d := a.Expr.Value(nil)
		diags = append(diags, d...)
		if !d.HasErrors() {
			if cv, err := convert.Convert(val, v.typ); err != nil {
				diags = append(diags, &hcl.Diagnostic{
					Severity: hcl.DiagError,
					Summary:  "Invalid default value for variable",
					Detail:   fmt.Sprintf("The default of variable %q does not match its type %s: %s.", v.name, typeexpr.TypeString(v.typ), err),
					Subject:  a.Expr.Range().Ptr(),
				})
			} else {
				v.value, v.hasValue = cv, true
			}
		}
	}
	return v, diags
}

// set converts val to v's type, reporting a mismatch at rng.
func (v *variable) set(val cty.Value, rng hcl.Range, origin string) hcl.Diagnostics {
	cv, err := convert.Convert(val, v.typ)
	if err != nil {
		return hcl.Diagnostics{{
			Severity: hcl.DiagError,
			Summary:  "Invalid value for variable",
			Detail:   fmt.Sprintf("%s for variable %q is not a %s: %s.", origin, v.name, typeexpr.TypeString(v.typ), err),
			Subject:  rng.Ptr(),
		}}
	}
	v.value, v.hasValue = cv, true
	return nil
}

// resolveVariables applies -var-file then -var values over the defaults and
// returns the `var` object for the evaluation context. Pseudo-files for the
// -var arguments are added to p, so Format can show them.
func resolveVariables(p *hclparse.Parser, vars map[string]*variable, o Options) (cty.Value, hcl.Diagnostics) {
	var diags hcl.Diagnostics
	undeclared := func(name string, rng hcl.Range, origin string) {
		diags = append(diags, &hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  "Undeclared variable",
			Detail:   fmt.Sprintf("%s sets %q, but the spec declares no variable %q; declare it with a variable %q { } block%s.", origin, name, name, name, didYouMean(name, vars)),
			Subject:  rng.Ptr(),
		})
	}
	for _, path := range o.VarFiles {
		var f *hcl.File
		var d hcl.Diagnostics
		if strings.HasSuffix(path, ".json") {
			f, d = p.ParseJSONFile(path)
		} else {
			f, d = p.ParseHCLFile(path)
		}
		diags = append(diags, d...)
		if f == nil || d.HasErrors() {
			continue
		}
		if d := checkSourceNumbers(f); d.HasErrors() {
			diags = append(diags, d...)
			continue
		}
		attrs, d := f.Body.JustAttributes()
		diags = append(diags, d...)
		names := make([]string, 0, len(attrs))
		for n := range attrs {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			a := attrs[n]
			v, ok := vars[n]
			if !ok {
				undeclared(n, a.NameRange, "-var-file "+path)
				continue
			}
			val, d := a.Expr.Value(nil)
			diags = append(diags, d...)
			if d.HasErrors() {
				continue
			}
			diags = append(diags, v.set(val, a.Expr.Range(), "The value in "+path)...)
		}
	}
	for _, arg := range o.Vars {
		// Each -var is a one-line pseudo-file named after itself, so its
		// errors point into the argument.
		filename := "<-var " + arg + ">"
		p.AddFile(filename, &hcl.File{Bytes: []byte(arg)})
		whole := hcl.Range{Filename: filename, Start: hcl.InitialPos,
			End: hcl.Pos{Line: 1, Column: 1 + len([]rune(arg)), Byte: len(arg)}}
		name, raw, ok := strings.Cut(arg, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" {
			diags = append(diags, &hcl.Diagnostic{
				Severity: hcl.DiagError,
				Summary:  "Invalid -var argument",
				Detail:   fmt.Sprintf("-var %q: expected name=value, e.g. -var workers=4.", arg),
				Subject:  whole.Ptr(),
			})
			continue
		}
		nameRange := hcl.Range{Filename: filename, Start: hcl.InitialPos,
			End: hcl.Pos{Line: 1, Column: 1 + len([]rune(name)), Byte: len(name)}}
		v, ok := vars[name]
		if !ok {
			undeclared(name, nameRange, "-var")
			continue
		}
		offset := strings.Index(arg, "=") + 1
		start := hcl.Pos{Line: 1, Column: 1 + len([]rune(arg[:offset])), Byte: offset}
		valRange := hcl.Range{Filename: filename, Start: start, End: whole.End}
		if !v.typed || v.typ.Equals(cty.String) {
			// A string (or untyped) variable takes the raw text, as in
			// Nomad and Terraform.
			v.value, v.hasValue = cty.StringVal(raw), true
			continue
		}
		if d := checkNumbers([]byte(raw), filename, start, true); d.HasErrors() {
			diags = append(diags, d...)
			continue
		}
		expr, d := hclsyntax.ParseExpression([]byte(raw), filename, start)
		var val cty.Value
		if !d.HasErrors() {
			val, d = expr.Value(nil)
		}
		if d.HasErrors() {
			// One diagnostic that says what the value should look like.
			diags = append(diags, &hcl.Diagnostic{
				Severity: hcl.DiagError,
				Summary:  "Invalid value for variable",
				Detail: fmt.Sprintf("-var %s: variable %q is a %s and %q is not one (%s). Values other than strings are HCL: 4, true, [\"a\", \"b\"], {k = \"v\"}.",
					name, name, typeexpr.TypeString(v.typ), raw, strings.TrimSuffix(d[0].Detail, ".")),
				Subject: valRange.Ptr(),
			})
			continue
		}
		diags = append(diags, v.set(val, valRange, "The -var value")...)
	}
	names := make([]string, 0, len(vars))
	for n := range vars {
		names = append(names, n)
	}
	sort.Strings(names)
	obj := make(map[string]cty.Value, len(vars))
	for _, n := range names {
		v := vars[n]
		if !v.hasValue {
			diags = append(diags, &hcl.Diagnostic{
				Severity: hcl.DiagError,
				Summary:  "No value for required variable",
				Detail:   fmt.Sprintf("Variable %q has no default: set it with -var %s=… or in a -var-file.", n, n),
				Subject:  v.defRange.Ptr(),
			})
			obj[n] = cty.DynamicVal
			continue
		}
		obj[n] = v.value
	}
	return cty.ObjectVal(obj), diags
}

func didYouMean(name string, vars map[string]*variable) string {
	best, bestD := "", 3
	for n := range vars {
		if d := levenshtein(name, n); d < bestD || (d == bestD && n < best) {
			best, bestD = n, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

func levenshtein(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// functions are the few functions a spec may call.
var functions = map[string]function.Function{
	"concat":    stdlib.ConcatFunc,
	"format":    stdlib.FormatFunc,
	"join":      stdlib.JoinFunc,
	"split":     stdlib.SplitFunc,
	"lower":     stdlib.LowerFunc,
	"upper":     stdlib.UpperFunc,
	"trimspace": stdlib.TrimSpaceFunc,
	"replace":   stdlib.ReplaceFunc,
	"min":       stdlib.MinFunc,
	"max":       stdlib.MaxFunc,
	"length":    stdlib.LengthFunc,
	"merge":     stdlib.MergeFunc,
	"tostring":  stdlib.MakeToFunc(cty.String),
	"tonumber":  stdlib.MakeToFunc(cty.Number),
	"tobool":    stdlib.MakeToFunc(cty.Bool),
	"tolist":    stdlib.MakeToFunc(cty.List(cty.DynamicPseudoType)),
	"tomap":     stdlib.MakeToFunc(cty.Map(cty.DynamicPseudoType)),
}
