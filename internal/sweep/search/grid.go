package search

import (
	"fmt"
	"math"
)

// Grid enumerates the cartesian product of a space's choice and grid
// params: the first param varies slowest, values in declared order, so the
// order is stable across restarts and readable in a status table.
type Grid struct {
	space Space
	size  int
}

var _ Sampler = (*Grid)(nil)

// NewGrid returns a grid search over space. Continuous and integer-range
// params are refused: a grid over them would need a resolution the spec does
// not give, and silently picking one would surprise.
func NewGrid(space Space) (*Grid, error) {
	if err := space.Validate(); err != nil {
		return nil, fmt.Errorf("grid search: %w", err)
	}
	size := 1
	for _, p := range space {
		if p.Kind != KindGrid && p.Kind != KindChoice {
			return nil, fmt.Errorf("grid search: param %q is %s; grid search takes only grid and choice params (list the values to try with grid = [...])", p.Name, p.Kind)
		}
		if size > math.MaxInt/len(p.Values) {
			return nil, fmt.Errorf("grid search: the product of the params' values overflows at param %q", p.Name)
		}
		size *= len(p.Values)
	}
	return &Grid{space: space, size: size}, nil
}

// Size returns the number of combinations.
func (g *Grid) Size() int { return g.size }

// At returns the i-th combination, 0 <= i < Size().
func (g *Grid) At(i int) Assignment {
	a := make(Assignment, len(g.space))
	// Mixed-radix decode with the last param as the fastest digit.
	for j := len(g.space) - 1; j >= 0; j-- {
		p := g.space[j]
		n := len(p.Values)
		a[p.Name] = p.Values[i%n]
		i /= n
	}
	return a
}

// Next returns the first combination that no trial in history has, whatever
// that trial's state: a failed combination is not retried here (retrying is
// the driver's restart policy), and a running one is not proposed twice.
// It returns ErrExhausted once every combination is taken.
func (g *Grid) Next(history []Trial) (Assignment, error) {
	taken := make(map[string]bool, len(history))
	for _, t := range history {
		taken[t.Params.Key()] = true
	}
	for i := range g.size {
		a := g.At(i)
		if !taken[a.Key()] {
			return a, nil
		}
	}
	return nil, fmt.Errorf("grid search after %d trials: all %d combinations taken: %w", len(history), g.size, ErrExhausted)
}
