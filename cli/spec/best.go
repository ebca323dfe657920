package spec

import (
	"fmt"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/hashicorp/hcl/v2/hclwrite"
	"github.com/zclconf/go-cty/cty"

	"github.com/gpujob/gpujob/internal/sweep/search"
)

// BestTrain turns a sweep spec's source into a train spec named name: the
// sweep's train block with every param.NAME replaced by a's value (as a
// string: params only reach command, args and env), beside the file's other
// blocks (variables), as the user wrote them.
func BestTrain(src []byte, filename, name string, a search.Assignment) ([]byte, error) {
	f, diags := hclwrite.ParseConfig(src, filename, hcl.InitialPos)
	if diags.HasErrors() {
		return nil, fmt.Errorf("%s: %s", filename, diags.Error())
	}
	out := hclwrite.NewEmptyFile()
	found := false
	for _, b := range f.Body().Blocks() {
		if b.Type() != "sweep" {
			out.Body().AppendBlock(b)
			out.Body().AppendNewline()
			continue
		}
		for _, inner := range b.Body().Blocks() {
			if inner.Type() != "train" {
				continue
			}
			found = true
			train := out.Body().AppendNewBlock("train", []string{name})
			train.Body().AppendUnstructuredTokens(substituteParams(inner.Body().BuildTokens(nil), a))
		}
	}
	if !found {
		return nil, fmt.Errorf("%s: no sweep block with a train block", filename)
	}
	return out.Bytes(), nil
}

// substituteParams replaces each param . NAME traversal by a quoted value.
func substituteParams(toks hclwrite.Tokens, a search.Assignment) hclwrite.Tokens {
	var out hclwrite.Tokens
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		if t.Type == hclsyntax.TokenIdent && string(t.Bytes) == "param" && i+2 < len(toks) &&
			toks[i+1].Type == hclsyntax.TokenDot && toks[i+2].Type == hclsyntax.TokenIdent {
			if v, ok := a[string(toks[i+2].Bytes)]; ok {
				lit := hclwrite.TokensForValue(cty.StringVal(v.String()))
				if len(lit) > 0 {
					lit[0].SpacesBefore = t.SpacesBefore
				}
				out = append(out, lit...)
				i += 2
				continue
			}
		}
		out = append(out, t)
	}
	return out
}
