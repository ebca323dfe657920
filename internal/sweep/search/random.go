package search

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// Random draws every param independently and uniformly (in log space for
// loguniform). Trial i's draw depends only on (seed, i), so a replayed
// history reproduces every proposal.
type Random struct {
	space Space
	seed  uint64
}

var _ Sampler = (*Random)(nil)

// NewRandom returns a random search over space.
func NewRandom(space Space, seed uint64) (*Random, error) {
	if err := space.Validate(); err != nil {
		return nil, fmt.Errorf("random search: %w", err)
	}
	return &Random{space: space, seed: seed}, nil
}

// Next returns the draw for trial len(history).
func (r *Random) Next(history []Trial) (Assignment, error) {
	return sampleSpace(r.space, trialRand(r.seed, len(history))), nil
}

// trialRand returns the generator for trial index of a sweep with seed. The
// two inputs go through splitmix64 so that neighbouring seeds and indices
// start from unrelated PCG states.
func trialRand(seed uint64, index int) *rand.Rand {
	return rand.New(rand.NewPCG(splitmix64(seed), splitmix64(seed^splitmix64(uint64(index)+0x5eed))))
}

func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// sampleSpace draws each param of space in order from r.
func sampleSpace(space Space, r *rand.Rand) Assignment {
	a := make(Assignment, len(space))
	for _, p := range space {
		a[p.Name] = sampleParam(p, r)
	}
	return a
}

// sampleParam draws one value of p from its prior.
func sampleParam(p Param, r *rand.Rand) Value {
	switch p.Kind {
	case KindUniform:
		return FloatValue(clamp(p.Lo+r.Float64()*(p.Hi-p.Lo), p.Lo, p.Hi))
	case KindLogUniform:
		lo, hi := math.Log(p.Lo), math.Log(p.Hi)
		// exp(log(x)) may land an ulp outside the bounds; clamp keeps Contains true.
		return FloatValue(clamp(math.Exp(lo+r.Float64()*(hi-lo)), p.Lo, p.Hi))
	case KindIntUniform:
		return IntValue(int64(p.Lo) + r.Int64N(int64(p.Hi)-int64(p.Lo)+1))
	default: // choice, grid
		return p.Values[r.IntN(len(p.Values))]
	}
}

func clamp(x, lo, hi float64) float64 { return math.Max(lo, math.Min(hi, x)) }
