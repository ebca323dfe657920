// Package ctyval builds the cty values that HCL writers (hclwrite) take from
// plain Go values: the rendered jobspecs of cli/render, and the specs the
// spec parser's fuzz test writes back.
package ctyval

import "github.com/zclconf/go-cty/cty"

// Strings is xs as a list of strings; an empty list (not null) for none.
func Strings(xs []string) cty.Value {
	if len(xs) == 0 {
		return cty.ListValEmpty(cty.String)
	}
	vals := make([]cty.Value, len(xs))
	for i, x := range xs {
		vals[i] = cty.StringVal(x)
	}
	return cty.ListVal(vals)
}

// StringMap is m as a map of strings; an empty map (not null) for none.
func StringMap(m map[string]string) cty.Value {
	if len(m) == 0 {
		return cty.MapValEmpty(cty.String)
	}
	vals := make(map[string]cty.Value, len(m))
	for k, v := range m {
		vals[k] = cty.StringVal(v)
	}
	return cty.MapVal(vals)
}
