// Package sweepplot draws the learning curves of a hyperparameter sweep's
// trials into one image: the picture behind `gpujob sweep report NAME -o
// sweep.png`.
//
// It is deliberately pure: it knows nothing of Consul, Nomad or the sweep
// controller. The caller collects each trial's objective metric points and
// hands them over as Curves; Render turns them into PNG, SVG or PDF bytes.
// Keeping I/O out makes the drawing testable without a cluster and lets the
// report command decide where the data comes from (live KV, a saved -json
// status, a fixture).
//
// What the picture encodes, and why:
//   - the best trial is drawn last, thick and in a highlight colour no other
//     trial uses, so it is never hidden under thirty other lines;
//   - a stopped trial ends in a red X at its last point, because "where did
//     early stopping cut this trial" is the question a sweep report answers;
//   - failed trials are dashed, so a crash is not mistaken for a plateau;
//   - every other trial is a thin line in a muted colour of its own.
//
// The legend sits beside the plot, not on it, so it never hides a curve. With
// few trials it names each one; with many it names the best and counts the
// rest by state, which keeps it readable at the sizes sweeps reach (~30).
package sweepplot
