// Package search holds a sweep's search space and the samplers that propose
// the next trial's parameters: exhaustive grid, seeded random and TPE.
//
// Every sampler is a pure function of (space, seed, options, history): it
// keeps no counters of its own. A controller that restarts, or a sweep that is
// extended long after it finished, replays the recorded history and gets
// exactly the assignment the original controller would have proposed.
package search

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// Kind names how a parameter is drawn, with the spelling of the sweep spec.
type Kind string

// The parameter kinds of a sweep spec.
const (
	KindUniform    Kind = "uniform"     // float in [Lo, Hi]
	KindLogUniform Kind = "loguniform"  // float in [Lo, Hi], uniform in log space; Lo > 0
	KindIntUniform Kind = "int_uniform" // integer in [Lo, Hi], both inclusive
	KindChoice     Kind = "choice"      // one of Values
	KindGrid       Kind = "grid"        // one of Values, enumerated exhaustively by Grid
)

// ValueKind tells which field of a Value is meaningful.
type ValueKind uint8

// The kinds of Value. The zero ValueKind marks an unset Value.
const (
	ValueInvalid ValueKind = iota
	ValueFloat
	ValueInt
	ValueString
)

// Value is one parameter value: a float64, an int64 or a string. It is a
// small comparable struct rather than an `any` so that the set of types is
// closed and equality (==) is exact, which Grid and assignment keys rely on.
type Value struct {
	kind ValueKind
	f    float64
	i    int64
	s    string
}

// FloatValue returns a float Value.
func FloatValue(f float64) Value { return Value{kind: ValueFloat, f: f} }

// IntValue returns an integer Value.
func IntValue(i int64) Value { return Value{kind: ValueInt, i: i} }

// StringValue returns a string Value.
func StringValue(s string) Value { return Value{kind: ValueString, s: s} }

// Kind reports which kind of value v holds.
func (v Value) Kind() ValueKind { return v.kind }

// Float64 returns v as a number; ok is false for strings and unset values.
func (v Value) Float64() (f float64, ok bool) {
	switch v.kind {
	case ValueFloat:
		return v.f, true
	case ValueInt:
		return float64(v.i), true
	}
	return 0, false
}

// Int64 returns v's integer; ok is false unless v holds an integer.
func (v Value) Int64() (i int64, ok bool) { return v.i, v.kind == ValueInt }

// Str returns v's string; ok is false unless v holds a string.
func (v Value) Str() (s string, ok bool) { return v.s, v.kind == ValueString }

// String formats v for tables and command lines: the shortest decimal that
// reads back to the same float, the integer, or the raw string.
func (v Value) String() string {
	switch v.kind {
	case ValueFloat:
		return strconv.FormatFloat(v.f, 'g', -1, 64)
	case ValueInt:
		return strconv.FormatInt(v.i, 10)
	case ValueString:
		return v.s
	}
	return "<unset>"
}

func (v Value) valid() error {
	switch v.kind {
	case ValueFloat:
		if math.IsNaN(v.f) || math.IsInf(v.f, 0) {
			return fmt.Errorf("value %v is not finite", v.f)
		}
		return nil
	case ValueInt, ValueString:
		return nil
	}
	return errors.New("value is unset")
}

// MarshalJSON writes floats always with a '.' or an exponent so that they
// read back as floats, never as integers: the round trip is exact, kind
// included, which matters once assignments are stored in Consul and compared
// after a controller restart.
func (v Value) MarshalJSON() ([]byte, error) {
	switch v.kind {
	case ValueFloat:
		if err := v.valid(); err != nil {
			return nil, fmt.Errorf("marshal value: %w", err)
		}
		s := strconv.FormatFloat(v.f, 'g', -1, 64)
		if !strings.ContainsAny(s, ".e") {
			s += ".0"
		}
		return []byte(s), nil
	case ValueInt:
		return []byte(strconv.FormatInt(v.i, 10)), nil
	case ValueString:
		return json.Marshal(v.s)
	}
	return nil, errors.New("marshal value: value is unset")
}

// UnmarshalJSON reads a JSON string as a string, a number without '.' or
// exponent as an integer and any other number as a float.
func (v *Value) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	if len(data) > 0 && data[0] == '"' {
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return fmt.Errorf("unmarshal value: %w", err)
		}
		*v = StringValue(s)
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(data, &n); err != nil {
		return fmt.Errorf("unmarshal value %s: want a number or a string: %w", data, err)
	}
	if !strings.ContainsAny(n.String(), ".eE") {
		i, err := strconv.ParseInt(n.String(), 10, 64)
		if err != nil {
			return fmt.Errorf("unmarshal value %s: %w", data, err)
		}
		*v = IntValue(i)
		return nil
	}
	f, err := strconv.ParseFloat(n.String(), 64)
	if err != nil {
		return fmt.Errorf("unmarshal value %s: %w", data, err)
	}
	*v = FloatValue(f)
	return nil
}

// Param is one named dimension of a search space. Lo and Hi bound the
// numeric kinds; Values lists the options of choice and grid.
type Param struct {
	Name   string
	Kind   Kind
	Lo, Hi float64
	Values []Value
}

// Uniform returns a float parameter drawn uniformly from [lo, hi].
func Uniform(name string, lo, hi float64) Param {
	return Param{Name: name, Kind: KindUniform, Lo: lo, Hi: hi}
}

// LogUniform returns a float parameter drawn uniformly in log space from [lo, hi].
func LogUniform(name string, lo, hi float64) Param {
	return Param{Name: name, Kind: KindLogUniform, Lo: lo, Hi: hi}
}

// IntUniform returns an integer parameter drawn uniformly from [lo, hi], both inclusive.
func IntUniform(name string, lo, hi int64) Param {
	return Param{Name: name, Kind: KindIntUniform, Lo: float64(lo), Hi: float64(hi)}
}

// Choice returns a parameter taking one of values.
func Choice(name string, values ...Value) Param {
	return Param{Name: name, Kind: KindChoice, Values: values}
}

// GridParam returns a parameter taking one of values, all of which a grid
// search visits. (The name Grid is taken by the sampler.)
func GridParam(name string, values ...Value) Param {
	return Param{Name: name, Kind: KindGrid, Values: values}
}

// maxExactInt bounds int_uniform so that its bounds survive float64 storage.
const maxExactInt = 1 << 53

// Validate reports the first problem with p, naming the parameter.
func (p Param) Validate() error {
	if p.Name == "" {
		return errors.New("param has no name")
	}
	if err := p.validate(); err != nil {
		return fmt.Errorf("param %q: %w", p.Name, err)
	}
	return nil
}

func (p Param) validate() error {
	switch p.Kind {
	case KindUniform, KindLogUniform, KindIntUniform:
		if len(p.Values) > 0 {
			return fmt.Errorf("%s takes bounds [lo, hi], not a list of values", p.Kind)
		}
		if math.IsNaN(p.Lo) || math.IsNaN(p.Hi) || math.IsInf(p.Lo, 0) || math.IsInf(p.Hi, 0) {
			return fmt.Errorf("%s bounds [%v, %v] must be finite", p.Kind, p.Lo, p.Hi)
		}
	case KindChoice, KindGrid:
		if len(p.Values) == 0 {
			return fmt.Errorf("%s needs at least one value", p.Kind)
		}
		seen := make(map[Value]int, len(p.Values))
		for i, v := range p.Values {
			if err := v.valid(); err != nil {
				return fmt.Errorf("%s value %d: %w", p.Kind, i+1, err)
			}
			if j, dup := seen[v]; dup {
				return fmt.Errorf("%s values %d and %d are both %s", p.Kind, j+1, i+1, v)
			}
			seen[v] = i
		}
		return nil
	case "":
		return errors.New("kind is not set (want uniform, loguniform, int_uniform, choice or grid)")
	default:
		return fmt.Errorf("unknown kind %q (want uniform, loguniform, int_uniform, choice or grid)", p.Kind)
	}
	switch p.Kind {
	case KindUniform:
		if !(p.Lo < p.Hi) {
			return fmt.Errorf("uniform needs lo < hi, got [%v, %v]", p.Lo, p.Hi)
		}
	case KindLogUniform:
		if !(p.Lo > 0) {
			return fmt.Errorf("loguniform needs lo > 0, got %v", p.Lo)
		}
		if !(p.Lo < p.Hi) {
			return fmt.Errorf("loguniform needs lo < hi, got [%v, %v]", p.Lo, p.Hi)
		}
	case KindIntUniform:
		if p.Lo != math.Trunc(p.Lo) || p.Hi != math.Trunc(p.Hi) {
			return fmt.Errorf("int_uniform needs integer bounds, got [%v, %v]", p.Lo, p.Hi)
		}
		if math.Abs(p.Lo) > maxExactInt || math.Abs(p.Hi) > maxExactInt {
			return fmt.Errorf("int_uniform bounds [%v, %v] exceed ±2^53", p.Lo, p.Hi)
		}
		if p.Lo > p.Hi {
			return fmt.Errorf("int_uniform needs lo <= hi, got [%v, %v]", p.Lo, p.Hi)
		}
	}
	return nil
}

// Contains reports whether v is a value p can take. History entries that
// fail it (a space edited between runs) are ignored by the samplers rather
// than allowed to skew the model.
func (p Param) Contains(v Value) bool {
	switch p.Kind {
	case KindUniform, KindLogUniform:
		f, ok := v.Float64()
		return ok && v.kind == ValueFloat && f >= p.Lo && f <= p.Hi
	case KindIntUniform:
		i, ok := v.Int64()
		return ok && float64(i) >= p.Lo && float64(i) <= p.Hi
	case KindChoice, KindGrid:
		return p.index(v) >= 0
	}
	return false
}

// index returns the position of v among p.Values, or -1.
func (p Param) index(v Value) int {
	for i, c := range p.Values {
		if c == v {
			return i
		}
	}
	return -1
}

// Space is the ordered list of a sweep's parameters. The order is part of
// the sampler's contract: draws are made param by param in this order, and
// Grid enumerates with the first param varying slowest.
type Space []Param

// Validate reports the first problem with s, naming the parameter.
func (s Space) Validate() error {
	if len(s) == 0 {
		return errors.New("search space has no params")
	}
	seen := make(map[string]bool, len(s))
	for i, p := range s {
		if err := p.Validate(); err != nil {
			return fmt.Errorf("search space param %d: %w", i+1, err)
		}
		if seen[p.Name] {
			return fmt.Errorf("search space: param %q is declared twice", p.Name)
		}
		seen[p.Name] = true
	}
	return nil
}

// Contains reports why a is not a point of s, or nil if it is.
func (s Space) Contains(a Assignment) error {
	for _, p := range s {
		v, ok := a[p.Name]
		if !ok {
			return fmt.Errorf("assignment lacks param %q", p.Name)
		}
		if !p.Contains(v) {
			return fmt.Errorf("param %q: %s is not a %s value of this space", p.Name, v, p.Kind)
		}
	}
	if len(a) != len(s) {
		return fmt.Errorf("assignment has %d params, the space %d", len(a), len(s))
	}
	return nil
}

// Assignment maps each param name to the value a trial runs with.
type Assignment map[string]Value

// Key is a canonical encoding of a: JSON with the names sorted (encoding/json
// sorts map keys). Two assignments are equal exactly when their keys are.
func (a Assignment) Key() string {
	b, err := json.Marshal(a)
	if err != nil {
		// Only unset or non-finite values fail; keep the key usable and distinct.
		return fmt.Sprintf("invalid:%v", map[string]Value(a))
	}
	return string(b)
}

// Equal reports whether a and b assign the same values to the same names.
func (a Assignment) Equal(b Assignment) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// String formats a as "name=value" pairs sorted by name, for tables and logs.
func (a Assignment) String() string {
	names := make([]string, 0, len(a))
	for k := range a {
		names = append(names, k)
	}
	sort.Strings(names)
	var b strings.Builder
	for i, k := range names {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%s", k, a[k])
	}
	return b.String()
}

// Trial is one entry of a sweep's history, in dispatch order. A trial that
// is neither Done nor Failed is still running (or pending): it counts as
// taken for Grid and towards the trial index, but has no objective yet.
type Trial struct {
	Params Assignment `json:"params"`
	Value  float64    `json:"value"`  // final objective; meaningful only when Done
	Done   bool       `json:"done"`   // completed with a final objective
	Failed bool       `json:"failed"` // ended without an objective
}

// Sampler proposes the next trial's parameters from the history so far.
// Implementations are deterministic in (construction arguments, history).
type Sampler interface {
	Next(history []Trial) (Assignment, error)
}

// ErrExhausted is returned by Grid once every combination is in the history.
var ErrExhausted = errors.New("search space exhausted")
