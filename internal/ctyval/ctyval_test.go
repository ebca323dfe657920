package ctyval

import (
	"testing"

	"github.com/zclconf/go-cty/cty"
)

func TestValues(t *testing.T) {
	if v := Strings(nil); !v.Type().Equals(cty.List(cty.String)) || v.LengthInt() != 0 || v.IsNull() {
		t.Errorf("Strings(nil) = %#v, want an empty list of strings", v)
	}
	if v := Strings([]string{"a", "b"}); !v.Equals(cty.ListVal([]cty.Value{cty.StringVal("a"), cty.StringVal("b")})).True() {
		t.Errorf("Strings(a, b) = %#v", v)
	}
	if v := StringMap(nil); !v.Type().Equals(cty.Map(cty.String)) || v.LengthInt() != 0 || v.IsNull() {
		t.Errorf("StringMap(nil) = %#v, want an empty map of strings", v)
	}
	if v := StringMap(map[string]string{"k": "v"}); v.Index(cty.StringVal("k")).AsString() != "v" {
		t.Errorf("StringMap(k: v) = %#v", v)
	}
}
