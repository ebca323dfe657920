package search

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
)

func TestParamValidate(t *testing.T) {
	tests := []struct {
		name  string
		param Param
		want  string // substring of the error; "" means valid
	}{
		{"uniform ok", Uniform("x", -1, 1), ""},
		{"uniform reversed", Uniform("x", 1, 1), `param "x": uniform needs lo < hi`},
		{"uniform nan", Uniform("x", math.NaN(), 1), "must be finite"},
		{"uniform inf", Uniform("x", 0, math.Inf(1)), "must be finite"},
		{"uniform with values", Param{Name: "x", Kind: KindUniform, Lo: 0, Hi: 1, Values: []Value{IntValue(1)}}, "not a list of values"},
		{"loguniform ok", LogUniform("lr", 1e-5, 1e-1), ""},
		{"loguniform zero lo", LogUniform("lr", 0, 1), `param "lr": loguniform needs lo > 0, got 0`},
		{"loguniform negative lo", LogUniform("lr", -1, 1), "lo > 0"},
		{"loguniform reversed", LogUniform("lr", 1, 0.5), "lo < hi"},
		{"int ok", IntUniform("n", 1, 8), ""},
		{"int single", IntUniform("n", 3, 3), ""},
		{"int reversed", IntUniform("n", 8, 1), "int_uniform needs lo <= hi"},
		{"int fractional", Param{Name: "n", Kind: KindIntUniform, Lo: 0.5, Hi: 2}, "integer bounds"},
		{"int huge", Param{Name: "n", Kind: KindIntUniform, Lo: 0, Hi: 1 << 60}, "2^53"},
		{"choice ok", Choice("opt", StringValue("adam"), StringValue("sgd"), IntValue(3)), ""},
		{"choice empty", Choice("opt"), `param "opt": choice needs at least one value`},
		{"choice duplicate", Choice("opt", IntValue(2), IntValue(4), IntValue(2)), "values 1 and 3 are both 2"},
		{"choice unset value", Choice("opt", Value{}), "value 1: value is unset"},
		{"choice nan", Choice("opt", FloatValue(math.NaN())), "not finite"},
		{"grid ok", GridParam("g", FloatValue(0.1), FloatValue(0.2)), ""},
		{"grid empty", GridParam("g"), "grid needs at least one value"},
		{"no name", Uniform("", 0, 1), "param has no name"},
		{"no kind", Param{Name: "x"}, "kind is not set"},
		{"unknown kind", Param{Name: "x", Kind: "normal"}, `unknown kind "normal"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.param.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tt.want != "" && err == nil:
				t.Fatalf("Validate() = nil, want error containing %q", tt.want)
			case tt.want != "" && !strings.Contains(err.Error(), tt.want):
				t.Fatalf("Validate() = %q, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestSpaceValidate(t *testing.T) {
	tests := []struct {
		name  string
		space Space
		want  string
	}{
		{"ok", Space{LogUniform("lr", 1e-5, 1e-1), Choice("layers", IntValue(2), IntValue(4))}, ""},
		{"empty", Space{}, "no params"},
		{"duplicate", Space{Uniform("x", 0, 1), IntUniform("x", 0, 1)}, `param "x" is declared twice`},
		{"bad param named with position", Space{Uniform("x", 0, 1), LogUniform("lr", 0, 1)}, `search space param 2: param "lr": loguniform needs lo > 0`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.space.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate() = %v, want error containing %q", err, tt.want)
			}
		})
	}
}

func TestSpaceContains(t *testing.T) {
	space := Space{LogUniform("lr", 1e-5, 1e-1), IntUniform("n", 1, 4), Choice("opt", StringValue("adam"), StringValue("sgd"))}
	tests := []struct {
		name string
		a    Assignment
		ok   bool
	}{
		{"inside", Assignment{"lr": FloatValue(1e-3), "n": IntValue(4), "opt": StringValue("sgd")}, true},
		{"lr out of range", Assignment{"lr": FloatValue(1), "n": IntValue(4), "opt": StringValue("sgd")}, false},
		{"n as float", Assignment{"lr": FloatValue(1e-3), "n": FloatValue(4), "opt": StringValue("sgd")}, false},
		{"unknown option", Assignment{"lr": FloatValue(1e-3), "n": IntValue(4), "opt": StringValue("rmsprop")}, false},
		{"missing", Assignment{"lr": FloatValue(1e-3), "n": IntValue(4)}, false},
		{"extra", Assignment{"lr": FloatValue(1e-3), "n": IntValue(4), "opt": StringValue("sgd"), "x": IntValue(1)}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := space.Contains(tt.a); (err == nil) != tt.ok {
				t.Fatalf("Contains(%v) = %v, want ok=%v", tt.a, err, tt.ok)
			}
		})
	}
}

func TestValueString(t *testing.T) {
	tests := []struct {
		v    Value
		want string
	}{
		{FloatValue(1e-5), "1e-05"},
		{FloatValue(0.001), "0.001"},
		{FloatValue(2), "2"},
		{IntValue(-7), "-7"},
		{StringValue("adam"), "adam"},
		{Value{}, "<unset>"},
	}
	for _, tt := range tests {
		if got := tt.v.String(); got != tt.want {
			t.Errorf("%#v.String() = %q, want %q", tt.v, got, tt.want)
		}
	}
}

func TestAssignmentJSONRoundTrip(t *testing.T) {
	tests := []Assignment{
		{"lr": FloatValue(1.2345678901234567e-4), "layers": IntValue(4), "opt": StringValue("adam")},
		{"whole float": FloatValue(2), "int": IntValue(2)}, // must stay distinct kinds
		{"neg zero": FloatValue(math.Copysign(0, -1)), "big": IntValue(math.MaxInt64), "tiny": FloatValue(5e-324)},
		{"quoted": StringValue(`a "b" \ c`), "numeric string": StringValue("3")},
		{"max": FloatValue(math.MaxFloat64), "min": IntValue(math.MinInt64)},
	}
	for _, a := range tests {
		t.Run(a.String(), func(t *testing.T) {
			data, err := json.Marshal(a)
			if err != nil {
				t.Fatal(err)
			}
			var back Assignment
			if err := json.Unmarshal(data, &back); err != nil {
				t.Fatalf("unmarshal %s: %v", data, err)
			}
			if !a.Equal(back) {
				t.Fatalf("round trip of %s: got %#v, want %#v", data, back, a)
			}
			if a.Key() != back.Key() {
				t.Fatalf("keys differ after round trip: %s vs %s", a.Key(), back.Key())
			}
			for k, v := range a {
				if math.Signbit(v.f) != math.Signbit(back[k].f) {
					t.Fatalf("%s lost its sign bit", k)
				}
			}
		})
	}
}

func TestAssignmentKeyCanonical(t *testing.T) {
	a := Assignment{"b": IntValue(1), "a": FloatValue(0.5)}
	b := Assignment{"a": FloatValue(0.5), "b": IntValue(1)}
	if a.Key() != b.Key() {
		t.Fatalf("same assignment, different keys: %s vs %s", a.Key(), b.Key())
	}
	if want := `{"a":0.5,"b":1}`; a.Key() != want {
		t.Fatalf("Key() = %s, want %s", a.Key(), want)
	}
	c := Assignment{"a": FloatValue(0.5), "b": FloatValue(1)}
	if a.Key() == c.Key() || a.Equal(c) {
		t.Fatalf("int 1 and float 1 must not compare equal: %s", c.Key())
	}
}

func TestValueUnmarshalErrors(t *testing.T) {
	for _, in := range []string{`true`, `null`, `[1]`, `{}`, `99999999999999999999`} {
		var v Value
		if err := json.Unmarshal([]byte(in), &v); err == nil {
			t.Errorf("Unmarshal(%s) = %v, want error", in, v)
		}
	}
	if _, err := json.Marshal(FloatValue(math.Inf(1))); err == nil {
		t.Error("Marshal(+Inf) succeeded, want error")
	}
}
