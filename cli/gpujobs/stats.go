package gpujobs

import (
	"strconv"

	"github.com/hashicorp/nomad/api"
)

// InstanceStats is the stats of the device id (a UUID) of the given model in
// a node's host stats, nil when absent.
func InstanceStats(hs *api.HostStats, vendor, model, id string) *api.DeviceStats {
	if hs == nil {
		return nil
	}
	for _, g := range hs.DeviceStats {
		if g == nil || g.Type != "gpu" || (model != "" && g.Name != model) || (vendor != "" && g.Vendor != "" && g.Vendor != vendor) {
			continue
		}
		if ds := g.InstanceStats[id]; ds != nil {
			return ds
		}
	}
	return nil
}

// StatNum is a stat's numerator and denominator; nil for a string ("N/A")
// or a missing value.
func StatNum(v *api.StatValue) (num, den *float64) {
	if v == nil {
		return nil, nil
	}
	switch {
	case v.FloatNumeratorVal != nil:
		n := *v.FloatNumeratorVal
		num = &n
	case v.IntNumeratorVal != nil:
		n := float64(*v.IntNumeratorVal)
		num = &n
	}
	switch {
	case v.FloatDenominatorVal != nil:
		d := *v.FloatDenominatorVal
		den = &d
	case v.IntDenominatorVal != nil:
		d := float64(*v.IntDenominatorVal)
		den = &d
	}
	return num, den
}

// AttrInt is a device attribute as an integer, nil when absent or not one.
func AttrInt(a *api.Attribute) *int64 {
	switch {
	case a == nil:
		return nil
	case a.IntVal != nil:
		v := *a.IntVal
		return &v
	case a.FloatVal != nil:
		v := int64(*a.FloatVal)
		return &v
	case a.StringVal != nil:
		if v, err := strconv.ParseInt(*a.StringVal, 10, 64); err == nil {
			return &v
		}
	}
	return nil
}

// AttrBool is a device attribute as a boolean, false when absent.
func AttrBool(a *api.Attribute) bool {
	switch {
	case a == nil:
		return false
	case a.BoolVal != nil:
		return *a.BoolVal
	case a.StringVal != nil:
		b, _ := strconv.ParseBool(*a.StringVal)
		return b
	}
	return false
}
