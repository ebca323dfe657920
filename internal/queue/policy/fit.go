package policy

import (
	"cmp"
	"slices"
)

// gangShape is what one fit question depends on besides the free space.
type gangShape struct{ per Resources }

// fitter holds each node's free resources while Decide admits gangs.
// Free space only shrinks during one Decide (admissions take it, and a
// preemptor takes only what its victims free), so once a gang of some
// shape does not fit, a gang of the same shape with as many members or
// more cannot either: the cache answers those in O(1), which keeps a
// Decide over thousands of blocked jobs cheap.
type fitter struct {
	free      []Resources
	totalFree Resources
	noFit     map[gangShape]int // smallest member count found not to fit
	// version counts changes of free, so that what is derived from it
	// (the backfill limit) is recomputed only when it changed.
	version int
}

func newFitter(free []Resources) *fitter {
	f := &fitter{free: free, noFit: map[gangShape]int{}}
	for _, r := range free {
		f.totalFree = f.totalFree.plus(r)
	}
	return f
}

// fits reports whether members × per fit now, each member on one node.
func (f *fitter) fits(per Resources, members int) bool {
	key := gangShape{per}
	if n, ok := f.noFit[key]; ok && members >= n {
		return false
	}
	// The whole gang must fit in the total first; most blocked jobs stop here.
	if per.times(members).countIn(f.totalFree) < 1 {
		f.noFit[key] = members
		return false
	}
	if countSlots(f.free, per, members) >= members {
		return true
	}
	if n, ok := f.noFit[key]; !ok || members < n {
		f.noFit[key] = members
	}
	return false
}

// take places the gang (which must fit) and removes it from the free space.
func (f *fitter) take(per Resources, members int) []nodeMembers {
	alloc := bestFit(f.free, per, members, nil)
	f.consume(alloc, per)
	return alloc
}

// consume removes alloc × per from the free space.
func (f *fitter) consume(alloc []nodeMembers, per Resources) {
	f.version++
	for _, a := range alloc {
		f.free[a.node] = f.free[a.node].minus(per.times(a.members))
		f.totalFree = f.totalFree.minus(per.times(a.members))
	}
}

// nodeMembers is some members of one gang on one node (by index).
type nodeMembers struct{ node, members int }

// countSlots counts members of size per that fit in free, stopping once it
// reaches want.
func countSlots(free []Resources, per Resources, want int) int {
	n := 0
	for _, r := range free {
		n += per.countIn(r)
		if n >= want {
			return n
		}
	}
	return n
}

// bestFit places members on the nodes with the least free GPUs that still
// take a member, filling each before the next: small holes are used up
// and whole nodes stay whole for the large gangs behind. Nodes marked in
// prefer (nil: none) come first: a preemptor goes where its victims were.
// It returns nil when the gang does not fit.
func bestFit(free []Resources, per Resources, members int, prefer []bool) []nodeMembers {
	type cand struct {
		node, slots, gpus int
		preferred         bool
	}
	var cands []cand
	total := 0
	for i, r := range free {
		if s := per.countIn(r); s > 0 {
			cands = append(cands, cand{i, s, r.GPUs, prefer != nil && prefer[i]})
			total += s
		}
	}
	if total < members {
		return nil
	}
	slices.SortFunc(cands, func(a, b cand) int {
		if a.preferred != b.preferred {
			if a.preferred {
				return -1
			}
			return 1
		}
		if c := cmp.Compare(a.gpus, b.gpus); c != 0 {
			return c
		}
		return cmp.Compare(a.node, b.node)
	})
	var alloc []nodeMembers
	left := members
	for _, c := range cands {
		if left == 0 {
			break
		}
		m := min(c.slots, left)
		alloc = append(alloc, nodeMembers{c.node, m})
		left -= m
	}
	return alloc
}

// placement names the nodes of an alloc, in node order.
func placement(alloc []nodeMembers, names []string) []NodeAlloc {
	out := make([]NodeAlloc, 0, len(alloc))
	for _, a := range alloc {
		out = append(out, NodeAlloc{Node: names[a.node], Members: a.members})
	}
	slices.SortFunc(out, func(a, b NodeAlloc) int { return cmp.Compare(a.Node, b.Node) })
	return out
}
