// Package pluginconfig encodes the body of a Nomad agent's plugin config
// block the way the agent's plugin loader does — HCL1 into a map, then the
// plugin's hclspec (with its defaults), then cty msgpack — so that tests of
// the device plugin and the task driver decode real agent configuration
// through their schemas without an agent.
package pluginconfig

import (
	"errors"
	"fmt"

	hcl1 "github.com/hashicorp/hcl"
	"github.com/hashicorp/nomad/helper/pluginutils/hclspecutils"
	"github.com/hashicorp/nomad/helper/pluginutils/hclutils"
	"github.com/hashicorp/nomad/plugins/shared/hclspec"
	"github.com/zclconf/go-cty/cty/msgpack"
)

// ErrInput marks a body that is not HCL, or a schema that does not convert:
// a broken test, not a config the schema refuses.
var ErrInput = errors.New("bad test input")

// Encode returns the msgpack the agent would send for body under spec. A
// config the schema refuses (unknown key, wrong type) is an error without
// ErrInput.
func Encode(spec *hclspec.Spec, body string) ([]byte, error) {
	var m map[string]interface{}
	if err := hcl1.Decode(&m, body); err != nil {
		return nil, fmt.Errorf("%w: parsing HCL: %v", ErrInput, err)
	}
	if m == nil {
		m = map[string]interface{}{}
	}
	dec, diags := hclspecutils.Convert(spec)
	if diags.HasErrors() {
		return nil, fmt.Errorf("%w: the spec does not convert: %v", ErrInput, diags)
	}
	val, diags, errs := hclutils.ParseHclInterface(m, dec, nil)
	if diags.HasErrors() {
		return nil, errors.Join(errs...)
	}
	data, err := msgpack.Marshal(val, val.Type())
	if err != nil {
		return nil, fmt.Errorf("%w: msgpack: %v", ErrInput, err)
	}
	return data, nil
}
