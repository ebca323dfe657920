package search

import (
	"errors"
	"strings"
	"testing"
)

func TestNewGridRefusesRanges(t *testing.T) {
	tests := []struct {
		name  string
		space Space
		want  string
	}{
		{"uniform", Space{GridParam("a", IntValue(1)), Uniform("x", 0, 1)}, `param "x" is uniform`},
		{"loguniform", Space{LogUniform("lr", 1e-5, 1)}, `param "lr" is loguniform`},
		{"int", Space{IntUniform("n", 1, 3)}, `param "n" is int_uniform`},
		{"invalid space", Space{GridParam("a")}, "grid needs at least one value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewGrid(tt.space)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("NewGrid() = %v, want error containing %q", err, tt.want)
			}
		})
	}
}

func TestGridOrderAndExhaustion(t *testing.T) {
	g, err := NewGrid(Space{
		GridParam("lr", FloatValue(0.1), FloatValue(0.01)),
		Choice("layers", IntValue(2), IntValue(4), IntValue(8)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if g.Size() != 6 {
		t.Fatalf("Size() = %d, want 6", g.Size())
	}
	// First param slowest, values in declared order.
	want := []string{
		"layers=2 lr=0.1", "layers=4 lr=0.1", "layers=8 lr=0.1",
		"layers=2 lr=0.01", "layers=4 lr=0.01", "layers=8 lr=0.01",
	}
	var history []Trial
	for i, w := range want {
		a, err := g.Next(history)
		if err != nil {
			t.Fatalf("Next after %d trials: %v", i, err)
		}
		if a.String() != w {
			t.Fatalf("trial %d = %s, want %s", i, a, w)
		}
		// Every state counts as taken: done, failed and still running.
		history = append(history, Trial{Params: a, Done: i%3 == 0, Failed: i%3 == 1})
	}
	if _, err := g.Next(history); !errors.Is(err, ErrExhausted) {
		t.Fatalf("Next after all combinations = %v, want ErrExhausted", err)
	}
}

func TestGridFillsGaps(t *testing.T) {
	g, err := NewGrid(Space{GridParam("x", IntValue(1), IntValue(2), IntValue(3))})
	if err != nil {
		t.Fatal(err)
	}
	// History out of order (a resumed sweep, or an earlier space): the first
	// untaken combination comes next, and foreign entries are ignored.
	history := []Trial{
		{Params: Assignment{"x": IntValue(3)}},
		{Params: Assignment{"x": IntValue(1)}, Done: true},
		{Params: Assignment{"x": IntValue(9)}, Done: true},
	}
	a, err := g.Next(history)
	if err != nil {
		t.Fatal(err)
	}
	if a.String() != "x=2" {
		t.Fatalf("Next = %s, want x=2", a)
	}
}
