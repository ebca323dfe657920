package sweep

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gpujob/gpujob/internal/sweep/controller"
)

// watch follows a sweep's state by blocking queries and shows one progress
// line (rewritten in place on a terminal, a new line per change otherwise)
// until the sweep has ended and its last trial is gone. Ctrl-C leaves it
// running.
func watch(ctx context.Context, e *env, name string) error {
	out := e.f.IO.Out
	rec, _, _, err := e.load(ctx, name)
	if err != nil {
		return err
	}
	s := e.sweeps()
	var index uint64
	last := ""
	for {
		st, meta, err := s.NextState(ctx, name, index, 15*time.Second)
		if err != nil {
			if ctx.Err() != nil {
				if e.f.IO.IsTTY {
					fmt.Fprintln(out)
				}
				fmt.Fprintf(out, "stopped watching; sweep %s keeps running: gpujob sweep status %s\n", name, name)
				return nil
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		index = meta.LastIndex
		if st == nil {
			return fmt.Errorf("sweep %s: its state is gone (purged by gpujob sweep stop --purge?)", name)
		}
		line := progressLine(st, rec.Metric, rec.Maximize())
		if line != last {
			if e.f.IO.IsTTY {
				fmt.Fprintf(out, "\r\033[K%s", line)
			} else {
				fmt.Fprintln(out, line)
			}
			last = line
		}
		if st.Ended.IsZero() {
			if why := s.ControllerTrouble(name); why != "" {
				if e.f.IO.IsTTY {
					fmt.Fprintln(out)
				}
				return fmt.Errorf("the controller of sweep %s cannot run: %s. Fix it (a wrong --controller-binary or $%s?), then "+
					"gpujob sweep extend %s --max-trials +0, or remove the sweep with gpujob sweep stop --purge %s",
					name, why, EnvControllerBinary, name, name)
			}
		}
		if st.Status.Terminal() && !st.Ended.IsZero() {
			if e.f.IO.IsTTY {
				fmt.Fprintln(out)
			}
			fmt.Fprintf(out, "sweep %s %s: %s\n", name, st.Status, st.Reason)
			if b := st.Best(rec.Maximize()); b != nil {
				fmt.Fprintf(out, "best: %s %s %s with %s\n", b.ID, rec.Metric, formatValue(b.Value), b.Params)
			}
			if st.Status != controller.StatusCompleted {
				return errors.New("sweep " + name + " " + string(st.Status))
			}
			return nil
		}
	}
}

func progressLine(st *controller.State, metric string, maximize bool) string {
	c := st.Counts()
	line := fmt.Sprintf("trials %d/%d: %d running, %d completed, %d stopped early, %d failed",
		len(st.Trials), st.MaxTrials, c[controller.TrialPending]+c[controller.TrialRunning]+c[controller.TrialStopping],
		c[controller.TrialCompleted], c[controller.TrialStopped], c[controller.TrialFailed])
	if b := st.Best(maximize); b != nil {
		line += fmt.Sprintf("; best %s %s %s", b.ID, metric, formatValue(b.Value))
	}
	return line
}
