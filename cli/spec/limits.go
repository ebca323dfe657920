package spec

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"strconv"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// maxNumberExp bounds the binary exponent of a number written in a spec or
// a variable value: float64's range, far beyond any count, size or
// duration a spec holds. HCL keeps numbers as arbitrary-precision floats,
// and turning one into decimal text (a template such as "${var.n}",
// tostring, an error message) takes time that grows with the square of its
// exponent: `workers = 1e10000000` kept the parser busy for minutes
// (found by FuzzParse).
const maxNumberExp = 1024

// checkNumbers refuses the number literals of native-syntax source src (a
// spec, a -var-file, or with expr a -var value) that are out of range.
func checkNumbers(src []byte, filename string, start hcl.Pos, expr bool) hcl.Diagnostics {
	lex := hclsyntax.LexConfig
	if expr {
		lex = hclsyntax.LexExpression
	}
	toks, _ := lex(src, filename, start) // the parser reports lexing errors
	var diags hcl.Diagnostics
	for _, tok := range toks {
		if tok.Type == hclsyntax.TokenNumberLit {
			diags = append(diags, checkNumber(string(tok.Bytes), tok.Range)...)
		}
	}
	return diags
}

// checkJSONNumbers is checkNumbers for a JSON spec or -var-file: its
// numbers, and those of the templates in its strings.
func checkJSONNumbers(src []byte, filename string) hcl.Diagnostics {
	dec := json.NewDecoder(bytes.NewReader(src))
	dec.UseNumber()
	var diags hcl.Diagnostics
	for {
		tok, err := dec.Token()
		if err != nil {
			return diags // the end, or an error the parser reports
		}
		rng := offsetRange(src, filename, int(dec.InputOffset()))
		switch v := tok.(type) {
		case json.Number:
			diags = append(diags, checkNumber(v.String(), rng)...)
		case string:
			toks, _ := hclsyntax.LexTemplate([]byte(v), filename, rng.Start)
			for _, t := range toks {
				if t.Type == hclsyntax.TokenNumberLit {
					diags = append(diags, checkNumber(string(t.Bytes), rng)...)
				}
			}
		}
	}
}

func checkNumber(lit string, rng hcl.Range) hcl.Diagnostics {
	f, _, err := big.ParseFloat(lit, 10, 64, big.ToNearestEven)
	if err != nil || f.Sign() == 0 {
		return nil
	}
	if exp := f.MantExp(nil); exp >= -maxNumberExp && exp <= maxNumberExp {
		return nil
	}
	shown := lit
	if len(shown) > 20 {
		shown = shown[:20] + "…"
	}
	return hcl.Diagnostics{{
		Severity: hcl.DiagError,
		Summary:  "Number out of range",
		Detail:   fmt.Sprintf("%s is beyond ±1.8e308 or nearer zero than 1e-308; a spec's numbers are counts, sizes and steps.", shown),
		Subject:  rng.Ptr(),
	}}
}

// offsetRange is the position of byte offset in src, as an empty range.
func offsetRange(src []byte, filename string, offset int) hcl.Range {
	offset = min(max(offset, 0), len(src))
	line := 1 + bytes.Count(src[:offset], []byte("\n"))
	col := offset - (bytes.LastIndexByte(src[:offset], '\n') + 1) + 1
	pos := hcl.Pos{Line: line, Column: col, Byte: offset}
	return hcl.Range{Filename: filename, Start: pos, End: pos}
}

// numberText shows a number for an error message without converting all of
// a huge one to decimal (see maxNumberExp): as a float64 when it is in
// range, else by its order of magnitude.
func numberText(bf *big.Float) string {
	if f, _ := bf.Float64(); !math.IsInf(f, 0) && (f != 0 || bf.Sign() == 0) {
		return strconv.FormatFloat(f, 'g', -1, 64)
	}
	return fmt.Sprintf("a number of about 2^%d", bf.MantExp(nil))
}

// checkSourceNumbers is checkNumbers or checkJSONNumbers for a parsed file.
func checkSourceNumbers(f *hcl.File) hcl.Diagnostics {
	if _, native := f.Body.(*hclsyntax.Body); !native {
		return checkJSONNumbers(f.Bytes, f.Body.MissingItemRange().Filename)
	}
	return checkNumbers(f.Bytes, f.Body.MissingItemRange().Filename, hcl.InitialPos, false)
}
